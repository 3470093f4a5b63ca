"""Property test of the job state machine: the API's cancel and a worker's claim, release and
finish, in any order. No transition leaves a final state; cancelling a finished job is 409."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine
from service.errors import ProblemError
from service.ids import new_id
from service.jobs import service
from service.migrate import upgrade
from service.models import FINAL_STATUSES, Dataset, Job, JobEvent, Tenant
from workers.jobs import lease

ALLOWED = {
    "queued": {"queued", "running", "cancelled"},
    "running": {"running", "cancelling", "queued", "succeeded", "failed", "cancelled"},
    "cancelling": {"cancelling", "succeeded", "failed", "cancelled"},
}


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
    def submit(self) -> None:
        self.job_id = new_id("job")
        self.epoch: int | None = None
        self.history: list[str] = []
        with self.sessions.begin() as s:
            s.add(Job(id=self.job_id, tenant_id="ten_fsm", dataset_id="ds_fsm", status="queued",
                      spec={}, total_steps=1, queue="q"))  # fmt: skip
        self.history.append("queued")

    def _status(self) -> str:
        with self.sessions() as s:
            return s.scalar(select(Job.status).where(Job.id == self.job_id))

    @rule()
    def api_cancel(self) -> None:
        before = self._status()
        try:
            with self.sessions.begin() as s:
                job = service.get_job(s, "ten_fsm", self.job_id)
                service.cancel_job(s, job)
        except ProblemError as exc:
            assert before in FINAL_STATUSES and exc.problem.status == 409
        else:
            assert before not in FINAL_STATUSES
        self.history.append(self._status())

    @rule()
    def worker_claim(self) -> None:
        with self.sessions.begin() as s:
            epoch = lease.claim(s, self.job_id, lease_seconds=60)
        if epoch is not None:
            self.epoch = epoch
        self.history.append(self._status())

    @rule()
    def worker_release(self) -> None:
        if self.epoch is not None:
            with self.sessions.begin() as s:
                lease.release(s, self.job_id, self.epoch)
        self.history.append(self._status())

    @rule(outcome=st.sampled_from(["succeeded", "failed", "cancelled"]))
    def worker_finish(self, outcome: str) -> None:
        if self.epoch is not None:
            with self.sessions.begin() as s:
                lease.finish(s, self.job_id, self.epoch, outcome)
        self.history.append(self._status())

    @invariant()
    def only_allowed_transitions(self) -> None:
        for before, after in zip(self.history, self.history[1:], strict=False):
            if before in FINAL_STATUSES:
                assert after == before, self.history
            else:
                assert after in ALLOWED[before], self.history

    @invariant()
    def a_final_job_has_finished_at_and_an_event(self) -> None:
        if not self.history or self.history[-1] not in FINAL_STATUSES:
            return
        with self.sessions() as s:
            job = s.get(Job, self.job_id)
            last = s.scalars(
                select(JobEvent).where(JobEvent.job_id == self.job_id).order_by(JobEvent.id.desc())
            ).first()
        assert job is not None and job.finished_at is not None
        assert last is not None and last.data.get("status") == job.status


def test_job_state_machine(engine: Engine) -> None:
    JobLifecycle.sessions = sessionmaker(engine, expire_on_commit=False)
    JobLifecycle.TestCase.settings = settings(
        max_examples=60,
        stateful_step_count=12,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    JobLifecycle.TestCase().runTest()
