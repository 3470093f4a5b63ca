"""The reconciler: the database row is the truth, so it repairs what the broker lost.

Every pass, idempotent and safe to run in many processes at once (each change is one
conditional UPDATE):
- a `cancelling` job whose lease expired (its worker died) becomes `cancelled`;
- a `running` job whose lease expired goes back to `queued` and is enqueued again (it resumes
  from its last committed checkpoint), or fails once it has used `max_attempts` claims;
- a `queued` job waiting longer than `requeue_after_seconds` while its queue holds no message
  at all had its message lost (a broker restart, a flushed Redis): it is enqueued again.
A duplicate message costs nothing: the claim lets exactly one run through.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db import session_scope
from service.jobs.events import add_event
from service.models import Job
from service.models.base import utcnow
from service.settings import Settings

log = logging.getLogger(__name__)

QueueDepth = Callable[[str], int | None]  # messages waiting in a queue; None when unknown


def reconcile(session: Session, settings: Settings, queue_depth: QueueDepth) -> list[Job]:
    """One pass; returns the jobs to enqueue once this transaction has committed."""
    now = utcnow()
    to_enqueue: list[Job] = []
    expired = select(Job).where(Job.status.in_(("running", "cancelling")), Job.lease_until < now)
    for job in session.scalars(expired).all():
        if job.status == "cancelling":
            _transition(session, job, "cancelled", "job cancelled (its worker was lost)")
        elif job.attempts >= settings.max_attempts:
            error = {
                "code": "attempts_exhausted",
                "message": f"the worker's lease expired on each of {job.attempts} attempts "
                f"(last epoch {job.epoch}); giving up",
            }
            _transition(session, job, "failed", f"job failed: {error['message']}", error)
        elif _transition(session, job, "queued", f"lease of epoch {job.epoch} expired; requeued"):
            to_enqueue.append(job)

    stale = now - timedelta(seconds=settings.requeue_after_seconds)
    waiting = select(Job).where(Job.status == "queued", Job.enqueued_at < stale)
    empty_queues: dict[str, bool] = {}
    for job in session.scalars(waiting).all():
        if job.queue not in empty_queues:
            empty_queues[job.queue] = queue_depth(job.queue) == 0
        if empty_queues[job.queue]:
            job.enqueued_at = now
            add_event(session, job.id, "requeued", "broker message lost; enqueued again", {})
            to_enqueue.append(job)
    session.flush()
    return to_enqueue


def _transition(
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


def run_once(settings: Settings) -> int:
    from workers.celery_app import enqueue_training, queue_depth

    with session_scope() as session:
        jobs = [(j.id, j.queue) for j in reconcile(session, settings, queue_depth)]
    for job_id, queue in jobs:
        enqueue_training(job_id, queue)
    return len(jobs)


def run_forever(settings: Settings, stop: threading.Event) -> None:
    """The reconciler loop, run beside every worker; errors are logged, never fatal."""
    while not stop.wait(settings.reconcile_seconds):
        try:
            if count := run_once(settings):
                log.info("reconciler enqueued %d job(s)", count)
        except Exception:
            log.exception("reconciler pass failed")
