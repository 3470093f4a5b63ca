from sqlalchemy import UniqueConstraint

from service.models.base import Base
from service.models.versioned import NamedVersion


class EnvironmentVersion(NamedVersion, Base):
    """One immutable version of a named multi-turn environment; (tenant, name, version) is
    unique. `sha256` is of the canonical kind+config: a job's episodes trace to the code."""

    __tablename__ = "environment_versions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name", "version", name="environment_name_version"),
    )
