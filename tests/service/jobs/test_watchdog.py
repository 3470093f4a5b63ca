"""The watchdog on both databases, with a stand-in training process (`fake_trainer.py`): the
lease is renewed from outside the training process while it makes progress, and a hung,
crashed or cancel-deaf one is killed and its attempt ended (issue 22 item 1)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.models import Job, JobEvent
from service.models.base import utcnow
from service.settings import QueueSettings, Settings
from service.training import kinds, runner, supervisor
from tests.service.jobs.test_lifecycle import make_job

FAKE = str(Path(__file__).with_name("fake_trainer.py"))


@pytest.fixture
def enqueued(sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The watchdog's units of work on the test's database; its enqueues, recorded."""

    @contextmanager
    def scope() -> Iterator[Session]:
        with sessions.begin() as session:
            yield session

    monkeypatch.setattr(runner, "session_scope", scope)
    monkeypatch.setattr(supervisor, "session_scope", scope)
    monkeypatch.setattr(kinds, "session_scope", scope)  # the claim's device turn
    sent: list[str] = []
    monkeypatch.setattr(
        kinds.worker, "enqueue_training", lambda job_id, _queue, _devices=1: sent.append(job_id)
    )
    return sent


def settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": tmp_path, "lease_seconds": 2.0, "heartbeat_seconds": 0.2,
        "step_timeout_s": 60.0, "queues": {"gpu": QueueSettings(step_timeout_s=1.5)},
        "cancel_grace_s": 0.5, "max_attempts": 2, **overrides,
    }  # fmt: skip
    return Settings.model_validate(values)


def supervise(job_id: str, cfg: Settings, *mode: str) -> float:
    start = time.monotonic()
    supervisor.supervise(kinds.JOB, job_id, cfg, [sys.executable, FAKE, *mode])
    return time.monotonic() - start


def job_row(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
    return job


def ended(sessions: sessionmaker[Session], job_id: str) -> list[dict]:
    with sessions.begin() as s:
        return [
            e.data
            for e in s.scalars(
                select(JobEvent)
                .where(JobEvent.job_id == job_id, JobEvent.type == "attempt_ended")
                .order_by(JobEvent.id)
            )
        ]


def test_a_hung_step_is_killed_and_requeued_then_fails_with_step_timeout(
    sessions: sessionmaker[Session], enqueued: list[str], tmp_path: Path
) -> None:
    job_id, cfg = make_job(sessions), settings(tmp_path)
    elapsed = supervise(job_id, cfg, "hang-in-step")
    assert 1.5 < elapsed < 5, elapsed
    job = job_row(sessions, job_id)
    assert (job.status, job.lease_until, enqueued) == ("queued", None, [job_id])
    elapsed = supervise(job_id, cfg, "hang-in-step")  # the second and last attempt
    job = job_row(sessions, job_id)
    assert job.status == "failed" and job.error is not None
    assert job.error["code"] == "step_timeout"
    assert "step 1 ran past its budget of 1.5s (queue 'gpu')" in job.error["message"]
    assert "every one of the 2 attempts ended by the watchdog" in job.error["message"]
    assert [(e["code"], e["epoch"], e["watchdog"]) for e in ended(sessions, job_id)] == [
        ("step_timeout", 1, True), ("step_timeout", 2, True)
    ]  # fmt: skip


def test_a_step_stuck_in_a_verifier_fails_with_verifier_timeout_naming_it(
    sessions: sessionmaker[Session], enqueued: list[str], tmp_path: Path
) -> None:
    job_id, cfg = make_job(sessions), settings(tmp_path, max_attempts=1)
    supervise(job_id, cfg, "hang-in-verifier")
    job = job_row(sessions, job_id)
    assert job.status == "failed" and job.error is not None and enqueued == []
    assert job.error["code"] == "verifier_timeout"
    assert "verifier 'spin' was still scoring" in job.error["message"]


def test_mixed_ends_fail_as_attempts_exhausted(
    sessions: sessionmaker[Session], enqueued: list[str], tmp_path: Path
) -> None:
    """One attempt crashed, the last one hung: not every attempt ended by the watchdog."""
    job_id, cfg = make_job(sessions), settings(tmp_path)
    elapsed = supervise(job_id, cfg, "die")
    assert elapsed < 1.5, elapsed  # requeued at once, not after the lease
    assert job_row(sessions, job_id).status == "queued" and enqueued == [job_id]
    supervise(job_id, cfg, "hang-in-step")
    job = job_row(sessions, job_id)
    assert job.status == "failed" and job.error is not None
    assert job.error["code"] == "attempts_exhausted"
    assert "the last: step 1 ran past its budget" in job.error["message"]
    assert [e["code"] for e in ended(sessions, job_id)] == ["crashed", "step_timeout"]
    assert "killed by SIGKILL" in ended(sessions, job_id)[0]["message"]


def test_the_lease_is_renewed_while_the_trainer_holds_its_gil_in_c(
    sessions: sessionmaker[Session], enqueued: list[str], tmp_path: Path
) -> None:
    job_id = make_job(sessions)
    cfg = settings(tmp_path, queues={"gpu": QueueSettings(step_timeout_s=30)})
    margins: list[float] = []  # lease_until - now, sampled while the trainer spins
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            lease = job_row(sessions, job_id).lease_until
            if lease is not None:  # SQLite hands back naive UTC
                lease = lease if lease.tzinfo else lease.replace(tzinfo=UTC)
                margins.append((lease - utcnow()).total_seconds())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # 1.5 leases of GIL held in C: unrenewed, the lease would lapse 1 s before the end
        elapsed = supervise(job_id, cfg, "hold-gil", "3")
    finally:
        done.set()
        sampler.join()
    assert elapsed > 3
    assert len(margins) > 10 and min(margins) > 0.5, margins  # never close to lapsing
    job = job_row(sessions, job_id)
    assert (job.status, job.epoch) == ("running", 1) and ended(sessions, job_id) == []


def test_steps_keep_the_watchdog_quiet(
    sessions: sessionmaker[Session], enqueued: list[str], tmp_path: Path
) -> None:
    """Six steps of 0.5 s each take 3 s, twice the step budget in all: each is within it."""
    job_id = make_job(sessions)
    assert supervise(job_id, settings(tmp_path), "steps", "6") > 3
    assert job_row(sessions, job_id).status == "running" and ended(sessions, job_id) == []


def test_a_cancelled_job_whose_trainer_ignores_it_is_killed_after_the_grace(
    sessions: sessionmaker[Session], enqueued: list[str], tmp_path: Path
) -> None:
    job_id = make_job(sessions)
    cfg = settings(tmp_path, queues={"gpu": QueueSettings(step_timeout_s=60)})

    def cancel() -> None:
        time.sleep(1.0)
        with sessions.begin() as s:
            s.execute(update(Job).where(Job.id == job_id).values(status="cancelling"))

    threading.Thread(target=cancel).start()
    elapsed = supervise(job_id, cfg, "ignore-cancel")
    assert 1.5 < elapsed < 4, elapsed  # cancel + a heartbeat + the 0.5 s grace
    job = job_row(sessions, job_id)
    assert job.status == "cancelled" and enqueued == []
    (cause,) = ended(sessions, job_id)
    assert cause["code"] == "cancel_timeout" and "within 0.5s of the cancel" in cause["message"]


def test_sigterm_reaches_the_training_process(
    sessions: sessionmaker[Session], enqueued: list[str], tmp_path: Path
) -> None:
    """The worker shutting down: the watchdog passes SIGTERM on (the real trainer then hands
    the job back at its next step boundary; this one just ends)."""
    job_id = make_job(sessions)
    cfg = settings(tmp_path, queues={"gpu": QueueSettings(step_timeout_s=60)})
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    assert supervise(job_id, cfg, "ignore-cancel") < 3
    assert job_row(sessions, job_id).status == "running" and ended(sessions, job_id) == []
