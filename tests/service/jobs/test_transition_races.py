"""The worker's and the reconciler's transitions racing the API's on PostgreSQL, as plain
functions over two sessions: each commits the API's move between the transition's read of the
job and its write, and the transition moves on from the status the API left (or not at all),
never from the one it read. The API's side of the same races: tests/api/test_transition_races.py."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from service.jobs import lifecycle
from service.models import Job, JobEvent
from service.models.base import utcnow
from service.training.reconciler import reconcile
from tests.service.jobs.test_lifecycle import make_job
from tests.service.jobs.test_reconciler import SETTINGS

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)

CRASHED = {"code": "crashed", "message": "the training process died", "watchdog": False}


def _api_cancel(session: Session, job_id: str) -> str:
    job = session.get(Job, job_id)
    assert job is not None
    return lifecycle.cancel(session, job).status


def _wait_for_a_lock_wait(sessions: sessionmaker[Session], timeout: float = 20) -> None:
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sessions() as s:
            if s.scalar(query):
                return
        time.sleep(0.02)
    raise AssertionError("the transition never waited on the held row")


def _events(sessions: sessionmaker[Session], job_id: str) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(JobEvent.type).where(JobEvent.job_id == job_id)))


def test_an_attempt_that_ends_under_a_cancel_ends_cancelled(
    sessions: sessionmaker[Session],
) -> None:
    """The watchdog records the end of a crashed attempt while the API's cancel of the running
    job is committing: the job ends `cancelled` now, not left `cancelling` until its lease
    expires."""
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 600)
    assert epoch is not None

    def end_attempt() -> str | None:
        with sessions.begin() as s:
            return lifecycle.end_attempt(s, job_id, epoch, 3, CRASHED)

    with ThreadPoolExecutor(1) as pool:
        with sessions.begin() as api:
            assert _api_cancel(api, job_id) == "cancelling"
            ended = pool.submit(end_attempt)
            _wait_for_a_lock_wait(sessions)
        assert ended.result(timeout=60) == "cancelled"
    with sessions() as s:
        assert s.scalar(select(Job.status).where(Job.id == job_id)) == "cancelled"


def test_a_lost_message_is_not_sent_again_for_a_job_cancelled_meanwhile(
    sessions: sessionmaker[Session],
) -> None:
    """The reconciler reads a queued job as waiting too long; the API cancels it before the
    reconciler marks it enqueued again: it is neither enqueued nor given a `requeued` event."""
    job_id = make_job(sessions)
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id)
                  .values(status="queued", enqueued_at=utcnow() - timedelta(hours=1)))  # fmt: skip

    def queue_depth(_queue: str) -> int:  # asked between the read and the requeue
        with sessions.begin() as api:
            assert _api_cancel(api, job_id) == "cancelled"
        return 0

    with sessions.begin() as s:
        enqueued = [j.id for j in reconcile(s, SETTINGS, queue_depth)]
    assert job_id not in enqueued
    assert "requeued" not in _events(sessions, job_id)
    with sessions() as s:
        assert s.scalar(select(Job.status).where(Job.id == job_id)) == "cancelled"
