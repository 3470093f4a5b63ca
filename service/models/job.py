from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow

FINAL_STATUSES = ("succeeded", "failed", "cancelled")
# Open jobs: they wait for or hold a device, and count toward the per-tenant open-jobs limit.
LIVE_STATUSES = ("queued", "running", "cancelling", "pausing")
# Not final: the job still needs its datasets, its checkpoints and its base. A `paused` job
# holds no lease and no device, so it is not open (a resume takes a place again), but it will
# train again: nothing it resumes from may go.
UNFINISHED_STATUSES = (*LIVE_STATUSES, "paused")


class Job(Base):
    """A training job: the row is the source of truth, the broker message only a wake-up.

    `epoch` is the fencing token: each claim increments it, and every write a run makes is
    conditioned on the epoch it claimed, so a worker that lost its lease can write nothing.
    """

    __tablename__ = "jobs"
    # The open-jobs count (`service.jobs.open_jobs`) reads a tenant's live jobs under its lock at
    # every submission: by (tenant, status), it reads those rows alone, not the tenant's whole
    # history. Its prefix serves every by-tenant read.
    __table_args__ = (Index("ix_jobs_tenant_id_status", "tenant_id", "status"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
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
    # Devices (ranks) one attempt trains on: `resources.devices` of the spec; routes it to a
    # worker that owns as many (`service.worker.celery_queue`).
    devices: Mapped[int] = mapped_column(Integer, default=1, server_default="1")

    @property
    def rollout_devices(self) -> int:
        """`resources.rollout_devices`: of the job's devices, those that only generate."""
        return int((self.spec.get("resources") or {}).get("rollout_devices", 0))

    @property
    def trainer_ranks(self) -> int:
        """The ranks that train: the job's devices but its rollout devices."""
        return self.devices - self.rollout_devices

    # The catalog model under this job's weights (through any chain of checkpoints).
    base_model: Mapped[str | None] = mapped_column(String(100), index=True, default=None)
    # Peak device memory estimated at submission (workers.grpo.memory), by part, in bytes.
    memory_estimate: Mapped[dict | None] = mapped_column(default=None)
    # Fine-tuned from this checkpoint (the tenant's own), or null for a catalog model. No
    # foreign key: the lineage outlives the checkpoint once no live job needs it.
    parent_checkpoint: Mapped[str | None] = mapped_column(String(64), index=True, default=None)
    # Forked from another job's checkpoint: {job_id, step, checkpoint_id}; a fork with no
    # checkpoint of its own yet resumes from that one (trainer state and step numbering too).
    forked_from: Mapped[dict | None] = mapped_column(default=None)
    # Created through POST /v1/fine_tuning/jobs: the OpenAI request it came from (model, files,
    # suffix, seed, method with its hyperparameters resolved), for its fine_tuning.job view.
    fine_tuning: Mapped[dict | None] = mapped_column(JSON(none_as_null=True), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
