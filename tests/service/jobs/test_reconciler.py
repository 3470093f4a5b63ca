"""The reconciler's decisions, as a plain function over both databases."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.jobs import lifecycle
from service.models import Job, JobEvent
from service.models.base import utcnow
from service.settings import Settings
from service.training.reconciler import reconcile
from tests.service.jobs.test_lifecycle import make_job

SETTINGS = Settings(max_attempts=2, requeue_after_seconds=30)


def expire(sessions: sessionmaker[Session], job_id: str) -> None:
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(lease_until=utcnow() - timedelta(1)))


def run(sessions: sessionmaker[Session], depth: int | None = 0) -> list[str]:
    with sessions.begin() as s:
        return [j.id for j in reconcile(s, SETTINGS, lambda _queue: depth)]


def job_row(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def test_expired_lease_is_requeued_then_fails_after_max_attempts(
    sessions: sessionmaker[Session],
) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        lifecycle.claim(s, job_id, 60)
    assert run(sessions) == []  # a live lease is left alone
    expire(sessions, job_id)
    assert job_id in run(sessions)
    assert job_row(sessions, job_id).status == "queued"
    with sessions.begin() as s:
        assert lifecycle.claim(s, job_id, 60) == 2
    expire(sessions, job_id)
    assert job_id not in run(sessions)
    job = job_row(sessions, job_id)
    assert job.status == "failed" and job.error is not None
    assert job.error["code"] == "attempts_exhausted" and "2 attempts" in job.error["message"]
    with sessions.begin() as s:
        history = s.scalars(select(JobEvent.data).where(JobEvent.job_id == job_id)).all()
    assert [h.get("epoch") for h in history if h.get("status") == "running"] == [1, 2]


def test_cancel_of_a_dead_worker_completes(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        lifecycle.claim(s, job_id, 60)
        s.execute(update(Job).where(Job.id == job_id).values(status="cancelling"))
    expire(sessions, job_id)
    assert run(sessions) == []
    assert job_row(sessions, job_id).status == "cancelled"


def test_lost_message_is_enqueued_again_only_when_the_queue_is_empty(
    sessions: sessionmaker[Session],
) -> None:
    job_id = make_job(sessions)
    old = utcnow() - timedelta(minutes=5)
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(enqueued_at=old))
    assert job_id not in run(sessions, depth=3)  # messages wait: ours may be among them
    assert job_id not in run(sessions, depth=None)  # the broker cannot tell: do nothing
    assert job_id in run(sessions, depth=0)
    assert job_id not in run(sessions, depth=0)  # enqueued_at moved: not again at once
