from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow

PREFLIGHT_FINAL = ("succeeded", "failed")


class Preflight(Base):
    """A pre-flight run of a job spec (`service.preflight`): the API inserts it and waits; a
    worker of the spec's queue claims it under a lease (`queued` -> `running`) and writes
    `result` or `error`. No foreign key to the datasets it reads: a pre-flight never holds one
    in place."""

    __tablename__ = "preflights"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    queue: Mapped[str] = mapped_column(String(64))
    # The spec as a job would store it (references pinned) and its catalog model.
    spec: Mapped[dict]
    base_model: Mapped[str] = mapped_column(String(100))
    memory_estimate: Mapped[dict | None] = mapped_column(default=None)
    result: Mapped[dict | None] = mapped_column(default=None)
    error: Mapped[dict | None] = mapped_column(default=None)
    # Claimed under a lease, as an evaluation (`service.preflight.rows`).
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
