from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class TinkerCheckpoint(Base):
    """Saved weights of a Tinker run: `training` (adapter + optimiser state, `save_state`) or
    `sampler` (a peft adapter directory, `save_weights_for_sampler`), one tar in storage.
    Its tinker:// path: tinker://<run_id>/weights/<name> or .../sampler_weights/<name>."""

    __tablename__ = "tinker_checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "kind", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("tinker_runs.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # training | sampler
    name: Mapped[str] = mapped_column(String(200))
    object_key: Mapped[str] = mapped_column(String(500))
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    user_metadata: Mapped[dict | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
