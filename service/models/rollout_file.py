from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class RolloutFile(Base):
    """One step's stored rollouts (a Parquet object) of one split of a job. Written after the
    object, by a fenced write: a run that lost its lease leaves no row, so nothing visible."""

    __tablename__ = "rollout_files"
    __table_args__ = (UniqueConstraint("job_id", "split", "step", name="job_split_step"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    split: Mapped[str] = mapped_column(String(16))  # "train" | "eval"
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer)
    object_key: Mapped[str] = mapped_column(String(500))
    rows: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
