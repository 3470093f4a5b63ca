from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow

FINAL_STATUSES = ("succeeded", "failed", "cancelled")
LIVE_STATUSES = ("queued", "running", "cancelling")


class Job(Base):
    """A training job: the row is the source of truth, the broker message only a wake-up.

    `epoch` is the fencing token: each claim increments it, and every write a run makes is
    conditioned on the epoch it claimed, so a worker that lost its lease can write nothing.
    """

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    eval_dataset_id: Mapped[str | None] = mapped_column(ForeignKey("datasets.id"), default=None)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    spec: Mapped[dict]
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer)
    latest_metrics: Mapped[dict | None] = mapped_column(default=None)
    error: Mapped[dict | None] = mapped_column(default=None)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    enqueued_at: Mapped[datetime | None] = mapped_column(default=None)
    queue: Mapped[str] = mapped_column(String(64), default="gpu")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
