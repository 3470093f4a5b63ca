"""The reconciler: the database row is the truth, so it repairs what the broker lost.

Every pass, idempotent and safe to run in many processes at once (each change is one
conditional UPDATE of `lifecycle`):
- a `cancelling` job whose lease expired (its worker died) becomes `cancelled`;
- a `running` job whose lease expired goes back to `queued` and is enqueued again (it resumes
  from its last committed checkpoint), or fails once it has used `max_attempts` claims;
- a `queued` job waiting longer than `requeue_after_seconds` while its queue holds no message
  at all had its message lost (a broker restart, a flushed Redis): it is enqueued again.
A duplicate message costs nothing: the claim lets exactly one run through. Evaluations and
pre-flights get the same passes (`reconcile_rows`, through `service.evaluations.rows` and
`service.preflight.rows`, which share the shape: expire, waiting_since, requeue). Tinker
requests whose lease lapsed are failed, never re-run (`reconcile_tinker`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

from sqlalchemy.orm import Session

from service import worker
from service.core import leases
from service.core.db import session_scope
from service.evaluations import rows as evaluation_rows
from service.jobs import lifecycle
from service.models import Job, TinkerRequest
from service.models.base import utcnow
from service.models.tinker_request import LEASE_LAPSED
from service.preflight import rows as preflight_rows
from service.settings import Settings

log = logging.getLogger(__name__)

QueueDepth = Callable[[str], int | None]  # messages waiting in a queue; None when unknown


def reconcile(session: Session, settings: Settings, queue_depth: QueueDepth) -> list[Job]:
    """One pass; returns the jobs to enqueue once this transaction has committed."""
    to_enqueue = lifecycle.expire(session, settings.max_attempts)
    stale = utcnow() - timedelta(seconds=settings.requeue_after_seconds)
    empty_queues: dict[str, bool] = {}
    for job in lifecycle.waiting_since(session, stale):
        broker_queue = worker.celery_queue(job.queue, job.devices)  # its device class's
        if broker_queue not in empty_queues:
            empty_queues[broker_queue] = queue_depth(broker_queue) == 0
        if empty_queues[broker_queue] and lifecycle.requeue(session, job):
            to_enqueue.append(job)
    session.flush()
    return to_enqueue


def reconcile_rows(
    session: Session, settings: Settings, queue_depth: QueueDepth, rows: ModuleType
) -> list[Any]:
    """The same pass over evaluations or pre-flights (`rows`, their transitions): lost leases
    taken back, lost messages sent again; returns the rows to enqueue once committed."""
    to_enqueue = rows.expire(session, settings.max_attempts)
    stale = utcnow() - timedelta(seconds=settings.requeue_after_seconds)
    empty: dict[str, bool] = {}
    for row in rows.waiting_since(session, stale):
        if row.queue not in empty:
            empty[row.queue] = queue_depth(row.queue) == 0
        if empty[row.queue]:
            rows.requeue(session, row)
            to_enqueue.append(row)
    session.flush()
    return to_enqueue


def reconcile_tinker(session: Session) -> int:
    """Fail the Tinker requests whose lease lapsed (their tinker worker died): a Tinker request is
    not idempotent and its run's state died with the worker, so it is failed, not queued again."""
    count = leases.fail_lapsed(session, TinkerRequest, LEASE_LAPSED)
    if count:
        log.warning("reconciler failed %d tinker request(s) whose lease lapsed", count)
    return count


def run_once(settings: Settings) -> int:
    with session_scope() as session:
        reconcile_tinker(session)
        found = reconcile(session, settings, worker.queue_depth)
        jobs = [(j.id, j.queue, j.devices) for j in found]
        evaluations = [
            (e.id, e.queue)
            for e in reconcile_rows(session, settings, worker.queue_depth, evaluation_rows)
        ]
        preflights = [
            (p.id, p.queue)
            for p in reconcile_rows(session, settings, worker.queue_depth, preflight_rows)
        ]
    for job_id, queue, devices in jobs:
        worker.enqueue_training(job_id, queue, devices)
    for evaluation_id, queue in evaluations:
        worker.enqueue_evaluation(evaluation_id, queue)
    for preflight_id, queue in preflights:
        worker.enqueue_preflight(preflight_id, queue)
    return len(jobs) + len(evaluations) + len(preflights)


def run_forever(settings: Settings, stop: threading.Event) -> None:
    """The reconciler loop, run beside every worker; errors are logged, never fatal."""
    while not stop.wait(settings.reconcile_seconds):
        try:
            if count := run_once(settings):
                log.info("reconciler enqueued %d job(s)", count)
        except Exception:
            log.exception("reconciler pass failed")
