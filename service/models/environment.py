from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class EnvironmentVersion(Base):
    """One immutable version of a named multi-turn environment; (tenant, name, version) is
    unique. `sha256` is of the canonical kind+config: a job's episodes trace to the code."""

    __tablename__ = "environment_versions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name", "version", name="environment_name_version"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    description: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict]
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
