from datetime import date

from sqlalchemy import BigInteger, Date, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base


class JobUsage(Base):
    """What a job's steps used on one UTC day on one kind of device (docs/usage.md): added to
    by each recorded step, in the step's own fenced transaction. Storage is not here: it is
    read from the job's stored objects (checkpoints, rollout files), always current."""

    __tablename__ = "job_usage"
    __table_args__ = (Index("ix_job_usage_tenant_day", "tenant_id", "day"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    device_kind: Mapped[str] = mapped_column(String(100), primary_key=True)  # cpu, cuda:<name>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    steps: Mapped[int] = mapped_column(Integer, default=0)  # steps recorded, redone ones too
    device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    trained_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    verifier_cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
