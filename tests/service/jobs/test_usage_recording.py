"""Step usage as the worker records it, on both databases, as plain functions: fenced, once per
step for tokens (a redone step adds device time only), and the budget's pause at the boundary."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.problems import ProblemError
from service.jobs import lifecycle
from service.models import Job, JobEvent, JobUsage, Tenant
from service.models.base import utcnow
from service.training.usage import StepUsage, UsageMeter, record_step_usage
from service.usage.budget import budget_state, refuse_over_budget
from tests.service.jobs.test_lifecycle import make_job


def usage(seconds: float = 2.0, completion: int = 40, trained: int = 100) -> StepUsage:
    return StepUsage("cpu", seconds, completion, trained, 0.5)


def totals(sessions: sessionmaker[Session], job_id: str) -> tuple[int, float, int, int, float]:
    with sessions.begin() as s:
        row = s.scalars(select(JobUsage).where(JobUsage.job_id == job_id)).one()
        return (
            row.steps, row.device_seconds, row.completion_tokens, row.trained_tokens,
            row.verifier_cpu_seconds,
        )  # fmt: skip


def test_a_redone_step_adds_device_time_but_not_tokens(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        old = lifecycle.claim(s, job_id, 60)
        record_step_usage(s, job_id, old, 1, {"reward_mean": 0.0}, usage())
        record_step_usage(s, job_id, old, 2, {"reward_mean": 0.0}, usage(3.0, 50, 120))
    assert totals(sessions, job_id) == (2, 5.0, 90, 220, 1.0)
    with sessions.begin() as s:  # the same write again (a retried commit): counted once
        record_step_usage(s, job_id, old, 2, {"reward_mean": 0.0}, usage(3.0, 50, 120))
    assert totals(sessions, job_id) == (2, 5.0, 90, 220, 1.0)
    with sessions.begin() as s:  # the lease runs out; another attempt redoes step 2
        s.execute(update(Job).where(Job.id == job_id).values(lease_until=utcnow() - timedelta(1)))
    with sessions.begin() as s:
        new = lifecycle.claim(s, job_id, 60)
        record_step_usage(s, job_id, new, 2, {"reward_mean": 0.0}, usage(4.0, 50, 120))
    assert totals(sessions, job_id) == (3, 9.0, 90, 220, 1.5)
    with pytest.raises(lifecycle.LeaseLost), sessions.begin() as s:  # the zombie: nothing
        record_step_usage(s, job_id, old, 3, {"reward_mean": 0.0}, usage(100.0, 1, 1))
    assert totals(sessions, job_id) == (3, 9.0, 90, 220, 1.5)


def test_crossing_the_budget_pauses_the_running_job(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        tenant_id = s.scalar(select(Job.tenant_id).where(Job.id == job_id))
        s.execute(update(Tenant).where(Tenant.id == tenant_id).values(budget_device_hours=0.001))
        epoch = lifecycle.claim(s, job_id, 60)
        refuse_over_budget(s, tenant_id)  # 0 of 3.6 s used: new jobs are welcome
        record_step_usage(s, job_id, epoch, 1, {"reward_mean": 0.0}, usage(seconds=2.0))
        assert s.scalar(select(Job.status).where(Job.id == job_id)) == "running"
        record_step_usage(s, job_id, epoch, 2, {"reward_mean": 0.0}, usage(seconds=2.0))
    with sessions.begin() as s:
        assert s.scalar(select(Job.status).where(Job.id == job_id)) == "pausing"
        event = s.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.type == "status")
            .order_by(JobEvent.id.desc())
        ).first()  # fmt: skip
        assert event is not None and event.data["status"] == "pausing"
        assert event.data["reason"] == "device-hour budget exhausted (used 0.00111 of 0.001 h)"
        assert event.data["budget"] == {"device_hours_limit": 0.001, "device_hours_used": 4 / 3600}
        state = budget_state(s, tenant_id)
        assert state is not None and state.exhausted
        with pytest.raises(ProblemError) as refused:
            refuse_over_budget(s, tenant_id)
    problem = refused.value.problem
    assert problem.status == 402 and problem.type.endswith("/budget-exhausted")
    assert "used 0.00111 of 0.001 h" in problem.detail


class _Spinning:
    """A scorer whose work is done by a child process burning CPU (as a sandbox does)."""

    name, weight = "spin", 1.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
        subprocess.run([sys.executable, "-c", code], check=True)
        return [1.0] * len(samples), [None] * len(samples)


def test_verifier_cpu_counts_the_child_processes() -> None:
    meter = UsageMeter()
    meter._kind = "cpu"  # no torch needed to read the device kind here
    [scorer] = meter.metered([_Spinning()])
    assert scorer.score([{"completion": "x"}]) == ([1.0], [None])
    step = meter.take({"completion_tokens": 7.0, "eval_completion_tokens": 3.0})
    assert 0.4 <= step.verifier_cpu_seconds < 2.0  # the child's CPU time, and its start-up
    assert step.completion_tokens == 10 and step.device_seconds > 0
    assert meter.take({}).verifier_cpu_seconds == 0.0  # taken: the next step starts over
