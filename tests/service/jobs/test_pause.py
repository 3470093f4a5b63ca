"""Pause and resume as plain functions on both databases: every transition a conditional UPDATE,
leases and fencing as for any other run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.jobs import lifecycle, pausing, run_writes
from service.models import Job, JobEvent
from service.models.base import utcnow
from tests.service.jobs.test_lifecycle import make_job

MAX_ATTEMPTS = 3


def _job(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _last_status_event(sessions: sessionmaker[Session], job_id: str) -> JobEvent:
    with sessions() as s:
        event = s.scalars(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.type == "status")
            .order_by(JobEvent.id.desc())
        ).first()
    assert event is not None
    return event


def test_a_queued_job_pauses_at_once_and_resumes(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        assert pausing.request_pause(s, job_id, "budget spent", {"tenant_budget_h": 1.0})
    assert _job(sessions, job_id).status == "paused"
    event = _last_status_event(sessions, job_id)
    assert event.message == "job paused: budget spent"
    assert event.data == {"status": "paused", "reason": "budget spent", "tenant_budget_h": 1.0}
    with sessions.begin() as s:
        assert lifecycle.claim(s, job_id, 60) is None  # its broker message finds nothing
        assert not pausing.request_pause(s, job_id, "again")  # paused already
    before = _job(sessions, job_id).enqueued_at
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and pausing.resume(s, job).status == "queued"
    after = _job(sessions, job_id)
    assert after.status == "queued" and after.enqueued_at is not None
    assert before is None or after.enqueued_at > before  # the reconciler's clock starts again
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None
        with pytest.raises(lifecycle.WrongStatus):
            pausing.resume(s, job)  # only a paused job resumes
        assert lifecycle.claim(s, job_id, 60) == 1


def test_a_running_job_pauses_at_its_step_boundary(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
        run_writes.record_step(s, job_id, epoch, 1, {"reward_mean": 0.5})
        assert pausing.request_pause(s, job_id, "requested by the API")
    assert _job(sessions, job_id).status == "pausing"
    with sessions.begin() as s:  # still its run's: the lease renews, the writes are fenced
        assert lifecycle.renew(s, job_id, epoch, 60) == "pausing"
        run_writes.record_step(s, job_id, epoch, 2, {"reward_mean": 0.6})
        assert not pausing.pause_attempt(s, job_id, epoch + 1, 2)  # not this epoch's
        assert not lifecycle.release(s, job_id, epoch)  # a pausing job is not handed back
        assert pausing.pause_attempt(s, job_id, epoch, 2)
    job = _job(sessions, job_id)
    assert (job.status, job.lease_until, job.step, job.finished_at) == ("paused", None, 2, None)
    assert job.attempts == 0  # asked to stop, not lost: no attempt used up
    assert _last_status_event(sessions, job_id).data == {
        "status": "paused", "epoch": epoch, "step": 2,
    }  # fmt: skip
    with pytest.raises(lifecycle.LeaseLost), sessions.begin() as s:
        run_writes.record_step(s, job_id, epoch, 3, {"reward_mean": 9.9})  # no lease any more
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None
        pausing.resume(s, job)
    with sessions.begin() as s:
        assert lifecycle.claim(s, job_id, 60) == epoch + 1  # a new epoch fences the old one


def test_a_pausing_job_whose_worker_died_becomes_paused(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
        pausing.request_pause(s, job_id, "requested by the API")
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(lease_until=utcnow() - timedelta(1)))
    with sessions.begin() as s:
        assert lifecycle.expire(s, MAX_ATTEMPTS) == []  # nothing to enqueue: it waits
    job = _job(sessions, job_id)
    assert job.status == "paused" and job.lease_until is None and job.finished_at is None
    with pytest.raises(lifecycle.LeaseLost), sessions.begin() as s:
        lifecycle.fence(s, job_id, epoch)


def test_the_watchdog_ending_a_pausing_attempt_pauses_it(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
        pausing.request_pause(s, job_id, "requested by the API")
        cause = {"code": "crashed", "message": "killed by SIGKILL", "watchdog": False}
        assert lifecycle.end_attempt(s, job_id, epoch, MAX_ATTEMPTS, cause) == "paused"
    assert _job(sessions, job_id).status == "paused"


@pytest.mark.parametrize(("before", "after"), [("paused", "cancelled"), ("pausing", "cancelling")])
def test_cancel_of_a_paused_or_pausing_job(
    sessions: sessionmaker[Session], before: str, after: str
) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
        pausing.request_pause(s, job_id, "requested by the API")
        if before == "paused":
            pausing.pause_attempt(s, job_id, epoch)
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == before
        assert lifecycle.cancel(s, job).status == after
    job = _job(sessions, job_id)
    assert job.status == after and (job.finished_at is not None) == (after == "cancelled")
    with sessions.begin() as s:
        assert not pausing.request_pause(s, job_id, "too late")


def test_a_final_job_neither_pauses_nor_resumes(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
        lifecycle.finish(s, job_id, epoch, "succeeded")
    with sessions.begin() as s:
        assert not pausing.request_pause(s, job_id, "requested by the API")
        job = s.get(Job, job_id)
        assert job is not None
        with pytest.raises(lifecycle.WrongStatus):
            pausing.resume(s, job)
    assert _job(sessions, job_id).status == "succeeded"
