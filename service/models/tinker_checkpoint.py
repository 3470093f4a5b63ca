from datetime import UTC, datetime

from sqlalchemy import BigInteger, ColumnElement, ForeignKey, String, UniqueConstraint, or_
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class TinkerCheckpoint(Base):
    """Saved weights of a Tinker run: `training` (adapter + optimiser state, `save_state`) or
    `sampler` (a peft adapter directory, `save_weights_for_sampler`), one tar in storage.
    Its tinker:// path: tinker://<run_id>/weights/<name> or .../sampler_weights/<name>.
    Past `expires_at` (the SDK's `ttl_seconds`) it answers as missing, and the next expiry pass
    deletes it (service/tinker/checkpoints.py)."""

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
    expires_at: Mapped[datetime | None] = mapped_column(default=None, index=True)

    @classmethod
    def unexpired(cls) -> ColumnElement[bool]:
        """Not past its expiry: every lookup's condition, so an expired checkpoint answers as
        missing before the expiry pass deletes it."""
        return or_(cls.expires_at.is_(None), cls.expires_at > utcnow())

    def is_expired(self) -> bool:
        """The same test on a loaded row (SQLite gives back naive UTC times)."""
        at = self.expires_at
        return at is not None and (at if at.tzinfo else at.replace(tzinfo=UTC)) <= utcnow()
