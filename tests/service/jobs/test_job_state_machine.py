"""Property test of the job state machine (`service.jobs.lifecycle`): create, then the API's
cancel, pause and resume, workers' claim, renew, release, pause and finish, lease expiry and
lost-message requeue, in any order and from two competing workers. No transition leaves a final
state, every transition is an allowed one, at most one epoch holds the job, and a stale epoch
can write nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.db import make_engine
from service.core.ids import new_id
from service.core.migrate import upgrade
from service.jobs import lifecycle, pausing, run_writes
from service.models import FINAL_STATUSES, Dataset, Job, JobEvent, JobMetric, Tenant
from service.models.base import utcnow

ALLOWED = {
    "queued": {"queued", "running", "cancelled", "paused"},
    "running": {"running", "cancelling", "pausing", "queued", "succeeded", "failed", "cancelled"},
    "cancelling": {"cancelling", "succeeded", "failed", "cancelled"},
    "pausing": {"pausing", "paused", "cancelling", "succeeded", "failed", "cancelled"},
    "paused": {"paused", "queued", "cancelled"},
}
MAX_ATTEMPTS = 3
WORKERS = st.sampled_from([0, 1])


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    url = f"sqlite:///{tmp_path_factory.mktemp('fsm') / 'grpo.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as s, s.begin():
        s.add(Tenant(id="ten_fsm", name="fsm"))
        s.flush()
        s.add(Dataset(id="ds_fsm", tenant_id="ten_fsm", name="d", num_records=1, sha256="0" * 64,
                      object_key="k"))  # fmt: skip
    return engine


class JobLifecycle(RuleBasedStateMachine):
    sessions: sessionmaker[Session]

    @initialize()
    def create(self) -> None:
        self.job_id = new_id("job")
        self.epochs: list[int | None] = [None, None]  # the epoch each of two workers claimed
        self.history: list[str] = []
        with self.sessions.begin() as s:
            job = Job(id=self.job_id, tenant_id="ten_fsm", dataset_id="ds_fsm", spec={},
                      total_steps=1, queue="q")  # fmt: skip
            assert lifecycle.create(s, job).status == "queued"
        self.history.append(self._status())

    def _status(self) -> str:
        with self.sessions() as s:
            return s.scalar(select(Job.status).where(Job.id == self.job_id))

    def _step(self) -> None:
        self.history.append(self._status())

    @rule()
    def api_cancel(self) -> None:
        before = self._status()
        try:
            with self.sessions.begin() as s:
                job = s.get(Job, self.job_id)
                assert job is not None
                after = lifecycle.cancel(s, job).status
        except lifecycle.AlreadyFinal:
            assert before in FINAL_STATUSES
        else:
            assert before not in FINAL_STATUSES
            moves = {"queued": "cancelled", "paused": "cancelled", "running": "cancelling",
                     "pausing": "cancelling"}  # fmt: skip
            assert after == moves.get(before, before)
        self._step()

    @rule()
    def api_pause(self) -> None:
        before = self._status()
        with self.sessions.begin() as s:
            asked = pausing.request_pause(s, self.job_id, "requested by the API")
        assert asked == (before in ("queued", "running"))
        if asked:
            assert self._status() == {"queued": "paused", "running": "pausing"}[before]
        self._step()

    @rule()
    def api_resume(self) -> None:
        before = self._status()
        try:
            with self.sessions.begin() as s:
                job = s.get(Job, self.job_id)
                assert job is not None
                pausing.resume(s, job)
        except lifecycle.WrongStatus:
            assert before != "paused"
        else:
            assert before == "paused" and self._status() == "queued"
        self._step()

    @rule(worker=WORKERS)
    def pause_at_step_boundary(self, worker: int) -> None:
        """The run saw `pausing`, checkpointed and stopped (runner.JobRun.release)."""
        epoch, before, holder = self.epochs[worker], self._status(), self._epoch()
        if epoch is None:
            return
        with self.sessions.begin() as s:
            paused = pausing.pause_attempt(s, self.job_id, epoch)
        assert paused == (before == "pausing" and epoch == holder)  # only the holder's run
        self._step()

    @rule(worker=WORKERS)
    def claim(self, worker: int) -> None:
        before = self._status()
        with self.sessions.begin() as s:
            epoch = lifecycle.claim(s, self.job_id, lease_seconds=60)
        if epoch is not None:
            assert before == "queued"  # a live lease is never taken over
            assert all(e is None or e < epoch for e in self.epochs)
            self.epochs[worker] = epoch
        self._step()

    @rule(worker=WORKERS)
    def renew_and_write(self, worker: int) -> None:
        epoch, before = self.epochs[worker], self._status()
        if epoch is None:
            return
        try:
            with self.sessions.begin() as s:
                status = lifecycle.renew(s, self.job_id, epoch, 60)
                run_writes.record_step(s, self.job_id, epoch, 1, {"reward_mean": float(epoch)})
        except lifecycle.LeaseLost:
            assert before in (*FINAL_STATUSES, "queued", "paused") or epoch != self._epoch()
        else:
            assert status == before and epoch == self._epoch()
        self._step()

    @rule(worker=WORKERS)
    def release(self, worker: int) -> None:
        if (epoch := self.epochs[worker]) is not None:
            with self.sessions.begin() as s:
                lifecycle.release(s, self.job_id, epoch)
        self._step()

    @rule(worker=WORKERS, outcome=st.sampled_from(["succeeded", "failed", "cancelled"]))
    def finish(self, worker: int, outcome: str) -> None:
        if (epoch := self.epochs[worker]) is not None:
            with self.sessions.begin() as s:
                done = lifecycle.finish(s, self.job_id, epoch, outcome)
            assert not done or self._status() == outcome
        self._step()

    @rule()
    def lease_expires(self) -> None:
        """The worker holding the job froze: its lease runs out and the reconciler moves on."""
        past = utcnow() - timedelta(seconds=1)
        with self.sessions.begin() as s:
            s.execute(update(Job).where(Job.id == self.job_id, Job.lease_until.is_not(None))
                      .values(lease_until=past))  # fmt: skip
            lifecycle.expire(s, MAX_ATTEMPTS)
        self._step()

    @rule()
    def message_lost(self) -> None:
        with self.sessions.begin() as s:
            for job in lifecycle.waiting_since(s, utcnow() + timedelta(seconds=1)):
                if job.id == self.job_id:
                    lifecycle.requeue(s, job)
        self._step()

    def _epoch(self) -> int:
        with self.sessions() as s:
            return s.scalar(select(Job.epoch).where(Job.id == self.job_id))

    @invariant()
    def only_allowed_transitions(self) -> None:
        for before, after in zip(self.history, self.history[1:], strict=False):
            if before in FINAL_STATUSES:
                assert after == before, self.history
            else:
                assert after in ALLOWED[before], self.history

    @invariant()
    def metrics_come_from_the_epoch_that_held_the_lease(self) -> None:
        with self.sessions() as s:
            rows = s.scalars(select(JobMetric).where(JobMetric.job_id == self.job_id)).all()
        for row in rows:
            assert row.metrics["reward_mean"] == float(row.epoch)

    @invariant()
    def a_final_job_has_finished_at_and_an_event(self) -> None:
        if not self.history or self.history[-1] not in FINAL_STATUSES:
            return
        with self.sessions() as s:
            job = s.get(Job, self.job_id)
            last = s.scalars(
                select(JobEvent).where(JobEvent.job_id == self.job_id).order_by(JobEvent.id.desc())
            ).first()
        assert job is not None and job.finished_at is not None and job.lease_until is None
        assert last is not None and last.data.get("status") == job.status

    @invariant()
    def attempts_are_bounded(self) -> None:
        with self.sessions() as s:
            job = s.get(Job, self.job_id)
        assert job is not None
        if job.status == "failed" and job.error and job.error["code"] == "attempts_exhausted":
            assert job.attempts >= MAX_ATTEMPTS


def test_job_state_machine(engine: Engine) -> None:
    JobLifecycle.sessions = sessionmaker(engine, expire_on_commit=False)
    JobLifecycle.TestCase.settings = settings(
        max_examples=80,
        stateful_step_count=16,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    JobLifecycle.TestCase().runTest()
