"""Leases with a fencing token: every write a run makes is conditioned on the epoch it claimed.

claim:    queued (or running with an expired lease) -> running, epoch+1, lease_until = now+ttl
renew:    lease_until = now+ttl WHERE epoch = mine
fenced:   any write first touches the job row WHERE epoch = mine; zero rows -> LeaseLost
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from service.jobs.events import add_event
from service.models import Checkpoint, Job, JobMetric
from service.models.base import utcnow

ACTIVE = ("running", "cancelling")


class LeaseLost(RuntimeError):
    """Another worker holds the job now (or it was finished): this run must write nothing."""


def claim(session: Session, job_id: str, lease_seconds: float, worker: str = "") -> int | None:
    """Take the job; returns the new epoch, or None when another worker has it or it is done."""
    now = utcnow()
    expired_running = and_(Job.status == "running", Job.lease_until < now)
    epoch = session.scalar(
        update(Job)
        .where(Job.id == job_id, or_(Job.status == "queued", expired_running))
        .values(
            status="running",
            epoch=Job.epoch + 1,
            attempts=Job.attempts + 1,
            lease_until=now + timedelta(seconds=lease_seconds),
            started_at=func.coalesce(Job.started_at, now),
        )
        .returning(Job.epoch)
    )
    if epoch is not None:
        data = {"status": "running", "epoch": epoch, "worker": worker}
        add_event(session, job_id, "status", f"job running on {worker or 'a worker'}", data)
    return epoch


def fence(session: Session, job_id: str, epoch: int, lease_seconds: float) -> str:
    """Renew the lease as the first write of a transaction; returns the job's status."""
    status = session.scalar(
        update(Job)
        .where(Job.id == job_id, Job.epoch == epoch, Job.status.in_(ACTIVE))
        .values(lease_until=utcnow() + timedelta(seconds=lease_seconds))
        .returning(Job.status)
    )
    if status is None:
        raise LeaseLost(f"job {job_id} epoch {epoch} no longer holds the lease")
    return status


def record_step(
    session: Session, job_id: str, epoch: int, lease_seconds: float, step: int, metrics: dict
) -> None:
    fence(session, job_id, epoch, lease_seconds)
    session.merge(JobMetric(job_id=job_id, step=step, epoch=epoch, metrics=metrics))
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(step=step, latest_metrics={"step": step, **metrics})
    )


def record_checkpoint(
    session: Session, job_id: str, epoch: int, lease_seconds: float, checkpoint: Checkpoint
) -> None:
    fence(session, job_id, epoch, lease_seconds)
    existing = session.scalar(
        select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == checkpoint.step)
    )
    if existing is not None:
        session.delete(existing)
        session.flush()
    session.add(checkpoint)
    add_event(
        session,
        job_id,
        "checkpoint",
        f"checkpoint at step {checkpoint.step}",
        {"step": checkpoint.step, "sha256": checkpoint.sha256, "size_bytes": checkpoint.size_bytes},
    )


def finish(
    session: Session, job_id: str, epoch: int, status: str, error: dict[str, Any] | None = None
) -> bool:
    """Move the job to a final status, only if this run still holds it."""
    done = session.scalar(
        update(Job)
        .where(Job.id == job_id, Job.epoch == epoch, Job.status.in_(ACTIVE))
        .values(status=status, error=error, finished_at=utcnow(), lease_until=None)
        .returning(Job.id)
    )
    if done is None:
        return False
    message = f"job {status}" + (f": {error['message']}" if error else "")
    add_event(session, job_id, "status", message, {"status": status, "error": error})
    return True


def release(session: Session, job_id: str, epoch: int) -> bool:
    """Hand a running job back to the queue (graceful shutdown); True if it was still ours."""
    done = session.scalar(
        update(Job)
        .where(Job.id == job_id, Job.epoch == epoch, Job.status == "running")
        .values(status="queued", lease_until=None, enqueued_at=utcnow())
        .returning(Job.id)
    )
    if done is not None:
        message = f"worker shutting down: epoch {epoch} handed the job back"
        add_event(session, job_id, "status", message, {"status": "queued", "epoch": epoch})
    return done is not None
