"""The job state machine: every transition of a job's row, each one conditional UPDATE.

    create   -> queued                                  (the API, on submission)
    claim    queued | running with an expired lease -> running, epoch + 1, lease_until = now+ttl
    renew    lease_until = now+ttl WHERE epoch = mine   (the watchdog, outside the training
             process, while it makes progress; returns the status)
    fence    every write of a run first checks WHERE epoch = mine; zero rows -> LeaseLost
    finish   running | cancelling | pausing -> succeeded | failed | cancelled, WHERE epoch = mine
    release  running -> queued WHERE epoch = mine       (graceful shutdown: hand the job back)
    end      running -> queued | failed, cancelling -> cancelled, pausing -> paused, WHERE
             epoch = mine (the watchdog killed the training process, or it died)
    cancel   queued | paused -> cancelled; running | pausing -> cancelling (the API; the run
             stops at a step)
    pause    queued -> paused; running -> pausing (the API, or a budget: pausing.py's
             request_pause; pause_attempt and resume live there too)
    paused   pausing -> paused WHERE epoch = mine       (the run checkpointed at a step boundary
             and stopped: pause_attempt; no lease, no worker)
    resume   paused -> queued (the API; the next claim resumes from the last checkpoint)
    expire   running | cancelling | pausing with an expired lease -> queued | failed |
             cancelled | paused
    requeue  queued, its broker message lost -> queued again (enqueued_at moves on)

The same as a drawing: docs/lifecycle.md.

A run's other writes (steps, checkpoints and their pruning, rollouts: `run_writes.py`; events)
are fenced the same way.

The row is the truth, the broker message only a wake-up: whoever calls a transition that
makes a job runnable (create, release, expire, requeue, resume) enqueues it after the commit.
Every change is a conditional UPDATE, so many workers, reconcilers and API replicas may race on
one job and exactly one wins. No web framework here: the API, the worker and the reconciler
share it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import case, literal, select, update
from sqlalchemy.orm import Session

from service.core import leases
from service.core.db import rows_matched
from service.core.leases import LeaseLost as LeaseLost  # raised by fence and renew
from service.models import FINAL_STATUSES, Job, JobEvent
from service.models.base import utcnow
from service.webhooks import outbox  # noqa: F401  (adds each event's webhook deliveries)

# Statuses that hold a lease: a run writes (fenced by its epoch) only while its job is in one.
ACTIVE = ("running", "cancelling", "pausing")
# The statuses a cancel moves on (`cancelling` is one already asked to stop).
_CANCELLABLE = ("queued", "paused", "running", "pausing")


class AlreadyFinal(RuntimeError):
    """The job has reached a final status; nothing moves it any more."""


class WrongStatus(RuntimeError):
    """The transition does not apply to the job's status (resume a job that is not paused)."""


def add_event(
    session: Session, job_id: str, type_: str, message: str, data: dict[str, Any] | None = None
) -> None:
    """Append to the job's event log (status changes, checkpoints, warnings)."""
    session.add(JobEvent(job_id=job_id, type=type_, message=message, data=data or {}))


def create(session: Session, job: Job, flush: bool = True) -> Job:
    """A new job row, queued; the caller enqueues it once the transaction has committed.
    `flush=False`: the caller adds more of the job's events first, for one flush of them all."""
    job.status, job.enqueued_at = "queued", utcnow()
    session.add(job)
    add_event(session, job.id, "status", "job queued", {"status": "queued"})
    if flush:
        session.flush()  # one flush for both rows (the job's id is ours; defaults fill in here)
    return job


def claim(session: Session, job_id: str, lease_seconds: float, worker: str = "") -> int | None:
    """Take the job; returns the new epoch, or None when another worker has it or it is done."""
    epoch = leases.claim(session, Job, job_id, lease_seconds, keep_first_start=True)
    if epoch is not None:
        data = {"status": "running", "epoch": epoch, "worker": worker}
        add_event(session, job_id, "status", f"job running on {worker or 'a worker'}", data)
    return epoch


def renew(session: Session, job_id: str, epoch: int, lease_seconds: float) -> str:
    """Extend this run's lease (the heartbeat, sent by the watchdog from outside the training
    process); returns the job's status (`cancelling` asks the run to stop). Raises LeaseLost
    when the run no longer holds the job."""
    return leases.renew(session, Job, job_id, epoch, lease_seconds, ACTIVE)


def fence(session: Session, job_id: str, epoch: int) -> str:
    """The first statement of every write of a run: a run that lost the job stops here, before
    writing anything (LeaseLost). It does not extend the lease: only the watchdog renews it,
    and only while the training process makes progress. Returns the job's status."""
    return leases.fence(session, Job, job_id, epoch, ACTIVE)


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


def end_attempt(
    session: Session, job_id: str, epoch: int, max_attempts: int, cause: dict[str, Any]
) -> str | None:
    """This run's attempt ended without an outcome of its own: the watchdog killed its training
    process (`cause["watchdog"]`), or the process died. `running` goes back to `queued` (the
    caller enqueues it; the next claim resumes from the last checkpoint) or, once the job has
    had `max_attempts` claims, to `failed`: with the watchdog's own code (`step_timeout`,
    `verifier_timeout`) when every attempt ended by the watchdog, else `attempts_exhausted`.
    `cancelling` becomes `cancelled`. `cause` = {code, message, watchdog, ...}, kept in an
    `attempt_ended` event. Returns the new status, or None when the run no longer holds the job."""
    # Locked from this read to the commit: a cancel or pause the API commits meanwhile waits,
    # rather than making the UPDATE below find nothing and leave the job to its lease's expiry.
    job = session.scalar(
        select(Job)
        .where(Job.id == job_id, Job.epoch == epoch, Job.status.in_(ACTIVE))
        .with_for_update()
    )
    if job is None:
        return None
    ended = session.scalars(
        select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.type == "attempt_ended")
    ).all()
    by_watchdog = sum(bool(d.get("watchdog")) for d in ended) + bool(cause.get("watchdog"))
    error: dict[str, Any] | None = None
    if job.status == "cancelling":
        status, message = "cancelled", "job cancelled"
    elif job.status == "pausing":  # its last committed checkpoint is the resume point
        status, message = "paused", "job paused (its attempt ended before the step boundary)"
    elif job.attempts < max_attempts:
        status, message = "queued", f"attempt {job.attempts} ended; requeued"
    elif by_watchdog >= job.attempts:
        status = "failed"
        error = {
            "code": cause["code"],
            "message": f"{cause['message']} (every one of the {job.attempts} attempts ended by "
            "the watchdog)",
        }
        message = f"job failed: {error['message']}"
    else:
        status = "failed"
        error = {
            "code": "attempts_exhausted",
            "message": f"{job.attempts} attempts used, none finished; the last: {cause['message']}",
        }
        message = f"job failed: {error['message']}"
    moved = rows_matched(
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.epoch == epoch, Job.status == job.status)
            .values(**_ended(status, error))
            .execution_options(synchronize_session=False)
        )
    )
    if not moved:
        return None
    ended_data = {"epoch": epoch, "attempt": job.attempts, **cause}
    add_event(session, job_id, "attempt_ended", cause["message"], ended_data)
    data = {"status": status, "epoch": epoch, "error": error}
    add_event(session, job_id, "status", message, data)
    return status


def cancel(session: Session, job: Job) -> Job:
    """A queued or paused job is cancelled at once; a running or pausing one is asked to stop
    at its next step (`cancelling`); a cancelling one stays so. One UPDATE chooses the move by
    the row's status as it is then, not as `job` was read: a job that finished (or was claimed)
    meanwhile is never overwritten. AlreadyFinal, naming its final status, for a final job."""
    at_once = Job.status.in_(("queued", "paused"))
    now = literal(utcnow(), Job.finished_at.type)
    moved = session.scalar(
        update(Job)
        .where(Job.id == job.id, Job.status.in_(_CANCELLABLE))
        .values(
            status=case((at_once, "cancelled"), else_="cancelling"),
            finished_at=case((at_once, now), else_=Job.finished_at),
        )
        .returning(Job.status)
        .execution_options(synchronize_session=False)
    )
    session.refresh(job)
    if moved is None and job.status in FINAL_STATUSES:
        raise AlreadyFinal(f"job '{job.id}' is already {job.status}")
    if moved == "cancelled":
        add_event(session, job.id, "status", "job cancelled", {"status": "cancelled"})
    elif moved == "cancelling":
        add_event(session, job.id, "status", "cancellation requested", {"status": "cancelling"})
    session.flush()
    return job


def expire(session: Session, max_attempts: int) -> list[Job]:
    """Move on every job whose lease expired (its worker died or froze): `cancelling` ->
    `cancelled`; `pausing` -> `paused` (its last committed checkpoint is the resume point);
    `running` -> `queued` to resume from its last checkpoint, or `failed`
    (`attempts_exhausted`) after `max_attempts` claims. Returns the jobs to enqueue."""
    requeued: list[Job] = []
    expired = select(Job).where(Job.status.in_(ACTIVE), Job.lease_until < utcnow())
    for job in session.scalars(expired).all():
        if job.status == "cancelling":
            _move_expired(session, job, "cancelled", "job cancelled (its worker was lost)")
        elif job.status == "pausing":
            _move_expired(session, job, "paused", "job paused (its worker was lost)")
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


def requeue(session: Session, job: Job) -> bool:
    """A queued job whose broker message was lost: mark it enqueued again (the caller sends);
    False when it is no longer queued (claimed, paused or cancelled since it was read)."""
    moved = rows_matched(
        session.execute(
            update(Job)
            .where(Job.id == job.id, Job.status == "queued")
            .values(enqueued_at=utcnow())
            .execution_options(synchronize_session=False)
        )
    )
    if moved:
        add_event(session, job.id, "requeued", "broker message lost; enqueued again", {})
    return bool(moved)


def waiting_since(session: Session, before: datetime) -> list[Job]:
    """Queued jobs last enqueued before `before` (candidates for `requeue`)."""
    return list(
        session.scalars(select(Job).where(Job.status == "queued", Job.enqueued_at < before))
    )


def _move_expired(
    session: Session, job: Job, status: str, message: str, error: dict[str, Any] | None = None
) -> bool:
    """Move an expired job on, only if nobody renewed or moved it since we read it."""
    moved = rows_matched(
        session.execute(
            update(Job)
            .where(Job.id == job.id, Job.epoch == job.epoch, Job.status == job.status)
            .where(Job.lease_until < utcnow())
            .values(**_ended(status, error))
            .execution_options(synchronize_session=False)
        )
    )
    if moved:
        data = {"status": status, "epoch": job.epoch, "attempts": job.attempts, "error": error}
        add_event(session, job.id, "status", message, data)
    return bool(moved)


def _ended(status: str, error: dict[str, Any] | None) -> dict[str, Any]:
    """The row's values once an attempt is over: no lease; a queued job is enqueued again, a
    paused one waits for its resume, a final one has finished."""
    values: dict[str, Any] = {"status": status, "lease_until": None}
    if status == "queued":
        values["enqueued_at"] = utcnow()
    elif status != "paused":
        values.update(finished_at=utcnow(), error=error)
    return values
