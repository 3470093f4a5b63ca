from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class TinkerSession(Base):
    """A Tinker SDK session (`kind` "session": the ServiceClient's, kept alive by heartbeats) or
    a sampling session inside one (`kind` "sampler": the weights a SamplingClient samples)."""

    __tablename__ = "tinker_sessions"
    __table_args__ = (Index("ix_tinker_sessions_tenant_id", "tenant_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    kind: Mapped[str] = mapped_column(String(16))  # session | sampler
    base_model: Mapped[str | None] = mapped_column(String(100), default=None)
    # sampler: a tinker:// sampler path (its checkpoint), or None for the base model itself
    model_path: Mapped[str | None] = mapped_column(String(500), default=None)
    clients: Mapped[int] = mapped_column(Integer, default=0)  # join_sampling_session's counter
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    # session: set by `finish`; later heartbeats answer 410, which ends the SDK's heartbeat loop,
    # and so do its runs' and sampling sessions' requests (service/tinker/service.py)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # sampler: the session it was made in (None for a session, and a sampler of before 0022)
    session_id: Mapped[str | None] = mapped_column(String(64), default=None)
