from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow

EVALUATION_FINAL = ("succeeded", "failed", "cancelled")


class Evaluation(Base):
    """A model sampled on a dataset and scored (`service.evaluations`). It runs on a worker as
    a job does: claimed under a lease (`epoch`, `lease_until`), renewed by the worker's pool
    process while the run lives, and every write of a run is fenced on its epoch. No foreign
    key to the dataset or checkpoint it reads: an evaluation never holds one in place."""

    __tablename__ = "evaluations"
    __table_args__ = (Index("ix_evaluations_tenant_id_id", "tenant_id", "id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    # queued -> running -> succeeded | failed; cancel: queued -> cancelled, running ->
    # cancelling -> cancelled (service.evaluations.rows)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    queue: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))  # as asked for: catalog, ckpt_ or ft: name
    base_model: Mapped[str] = mapped_column(String(100))  # the catalog model under the weights
    # The request with references resolved: dataset id, pinned verifiers, lineage, generation.
    spec: Mapped[dict]
    results: Mapped[dict | None] = mapped_column(default=None)
    error: Mapped[dict | None] = mapped_column(default=None)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    device_kind: Mapped[str | None] = mapped_column(String(100), default=None)
    device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    enqueued_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class EvaluationSample(Base):
    """One completion of an evaluation: `index` orders them record by record (the record's
    k samples consecutive); written by the run that holds the lease, with its epoch."""

    __tablename__ = "evaluation_samples"

    evaluation_id: Mapped[str] = mapped_column(
        ForeignKey("evaluations.id", ondelete="CASCADE"), primary_key=True
    )
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer)
    record: Mapped[int] = mapped_column(Integer)  # the record's position in the dataset
    sample: Mapped[int] = mapped_column(Integer)  # 0 .. samples_per_prompt - 1
    prompt: Mapped[str] = mapped_column(Text)
    completion: Mapped[str] = mapped_column(Text)
    reward: Mapped[float] = mapped_column(Float)
    scores: Mapped[dict]  # verifier -> score (None: the verifier failed on it)
    errors: Mapped[dict]  # verifier -> error text, for the verifiers that failed
    length: Mapped[int] = mapped_column(Integer)
    truncated: Mapped[bool]
    passed: Mapped[bool]
