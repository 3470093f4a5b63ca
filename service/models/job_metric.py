from sqlalchemy import ForeignKey, Integer
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base


class JobMetric(Base):
    """The metrics of one training step; one row per (job, step)."""

    __tablename__ = "job_metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)  # the run (claim) that wrote it
    metrics: Mapped[dict]
