"""The job state machine: every transition of a job's row, each one conditional UPDATE.

    create   -> queued                                  (the API, on submission)
    claim    queued | running with an expired lease -> running, epoch + 1, lease_until = now+ttl
    renew    lease_until = now+ttl WHERE epoch = mine   (the heartbeat; returns the status)
    fence    every write of a run first renews WHERE epoch = mine; zero rows -> LeaseLost
    finish   running | cancelling -> succeeded | failed | cancelled, WHERE epoch = mine
    release  running -> queued WHERE epoch = mine       (graceful shutdown: hand the job back)
    cancel   queued -> cancelled; running -> cancelling (the API; the run stops at a step)
    expire   running | cancelling with an expired lease -> queued | failed | cancelled
    requeue  queued, its broker message lost -> queued again (enqueued_at moves on)

The row is the truth, the broker message only a wake-up: whoever calls a transition that
makes a job runnable (create, release, expire, requeue) enqueues it after the commit. Every
change is a conditional UPDATE, so many workers, reconcilers and API replicas may race on one
job and exactly one wins. No web framework here: the API, the worker and the reconciler share it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from service.models import FINAL_STATUSES, Checkpoint, Job, JobEvent, JobMetric
from service.models.base import utcnow

ACTIVE = ("running", "cancelling")


class LeaseLost(RuntimeError):
    """Another worker holds the job now (or it was finished): this run must write nothing."""


class AlreadyFinal(RuntimeError):
    """The job has reached a final status; nothing moves it any more."""


def add_event(
    session: Session, job_id: str, type_: str, message: str, data: dict[str, Any] | None = None
) -> None:
    """Append to the job's event log (status changes, checkpoints, warnings)."""
    session.add(JobEvent(job_id=job_id, type=type_, message=message, data=data or {}))


def create(session: Session, job: Job) -> Job:
    """A new job row, queued; the caller enqueues it once the transaction has committed."""
    job.status, job.enqueued_at = "queued", utcnow()
    session.add(job)
    add_event(session, job.id, "status", "job queued", {"status": "queued"})
    session.flush()  # one flush for both rows (the job's id is ours; defaults fill in here)
    return job


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


def renew(session: Session, job_id: str, epoch: int, lease_seconds: float) -> str:
    """Extend this run's lease (the heartbeat); returns the job's status (`cancelling` asks the
    run to stop). Raises LeaseLost when the run no longer holds the job."""
    status = session.scalar(
        update(Job)
        .where(Job.id == job_id, Job.epoch == epoch, Job.status.in_(ACTIVE))
        .values(lease_until=utcnow() + timedelta(seconds=lease_seconds))
        .returning(Job.status)
    )
    if status is None:
        raise LeaseLost(f"job {job_id} epoch {epoch} no longer holds the lease")
    return status


# A fenced write renews the lease as the first write of its transaction: a run that lost the job
# stops there, before writing anything.
fence = renew


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


def cancel(session: Session, job: Job) -> Job:
    """A queued job is cancelled at once; a running one is asked to stop at its next step."""
    if job.status in FINAL_STATUSES:
        raise AlreadyFinal(f"job '{job.id}' is already {job.status}")
    if job.status == "queued":
        job.status, job.finished_at = "cancelled", utcnow()
        add_event(session, job.id, "status", "job cancelled", {"status": "cancelled"})
    elif job.status == "running":
        job.status = "cancelling"
        add_event(session, job.id, "status", "cancellation requested", {"status": "cancelling"})
    session.flush()
    return job


def expire(session: Session, max_attempts: int) -> list[Job]:
    """Move on every job whose lease expired (its worker died or froze): `cancelling` ->
    `cancelled`; `running` -> `queued` to resume from its last checkpoint, or `failed`
    (`attempts_exhausted`) after `max_attempts` claims. Returns the jobs to enqueue."""
    requeued: list[Job] = []
    expired = select(Job).where(Job.status.in_(ACTIVE), Job.lease_until < utcnow())
    for job in session.scalars(expired).all():
        if job.status == "cancelling":
            _move_expired(session, job, "cancelled", "job cancelled (its worker was lost)")
        elif job.attempts >= max_attempts:
            error = {
                "code": "attempts_exhausted",
                "message": f"the worker's lease expired on each of {job.attempts} attempts "
                f"(last epoch {job.epoch}); giving up",
            }
            _move_expired(session, job, "failed", f"job failed: {error['message']}", error)
        elif _move_expired(session, job, "queued", f"lease of epoch {job.epoch} expired; requeued"):
            requeued.append(job)
    return requeued


def requeue(session: Session, job: Job) -> None:
    """A queued job whose broker message was lost: mark it enqueued again (the caller sends)."""
    job.enqueued_at = utcnow()
    add_event(session, job.id, "requeued", "broker message lost; enqueued again", {})


def waiting_since(session: Session, before: datetime) -> list[Job]:
    """Queued jobs last enqueued before `before` (candidates for `requeue`)."""
    return list(
        session.scalars(select(Job).where(Job.status == "queued", Job.enqueued_at < before))
    )


def _move_expired(
    session: Session, job: Job, status: str, message: str, error: dict | None = None
) -> bool:
    """Move an expired job on, only if nobody renewed or moved it since we read it."""
    now = utcnow()
    values: dict = {"status": status, "lease_until": None}
    if status == "queued":
        values["enqueued_at"] = now
    else:
        values.update(finished_at=now, error=error)
    moved = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.epoch == job.epoch, Job.status == job.status)
        .where(Job.lease_until < now)
        .values(**values)
        .execution_options(synchronize_session=False)
    ).rowcount
    if moved:
        data = {"status": status, "epoch": job.epoch, "attempts": job.attempts, "error": error}
        add_event(session, job.id, "status", message, data)
    return bool(moved)
