"""Turns between tenants on a device queue, across jobs, evaluations and pre-flights
(`service.training.turns`), on both databases: whatever row a message names, the worker runs
the row of the tenant served longest ago, so a tenant that queued many runs first delays
another's next run by one run, not by all of its own."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.core.ids import new_id
from service.models import Evaluation, Job, Preflight
from service.models.base import utcnow
from service.training import kinds, runner, turns
from tests.service.jobs.test_lifecycle import make_job

EXITS = [sys.executable, "-c", "pass"]  # a run that ends at once (its row stays claimed)


def _queued(
    sessions: sessionmaker[Session], tenant_id: str, minutes_ago: float, queue: str
) -> dict[str, str]:
    """A job, an evaluation and a pre-flight of the tenant on `queue`, queued `minutes_ago` (in
    that order, a second apart)."""
    at = utcnow() - timedelta(minutes=minutes_ago)
    job_id = make_job(sessions)
    with sessions.begin() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(tenant_id=tenant_id, enqueued_at=at, queue=queue)
        )
        evaluation = Evaluation(id=new_id("eval"), tenant_id=tenant_id, queue=queue, model="m",
                                base_model="m", spec={}, status="queued",
                                enqueued_at=at + timedelta(seconds=1))  # fmt: skip
        preflight = Preflight(id=new_id("pf"), tenant_id=tenant_id, queue=queue, spec={},
                              base_model="m", enqueued_at=at + timedelta(seconds=2))  # fmt: skip
        s.add_all([evaluation, preflight])
    return {"job": job_id, "evaluation": evaluation.id, "pre-flight": preflight.id}


def _tenant_of(sessions: sessionmaker[Session], job_id: str) -> str:
    with sessions() as s:
        return s.get_one(Job, job_id).tenant_id


def _claimed(sessions: sessionmaker[Session]) -> set[str]:
    with sessions() as s:
        return {
            row_id
            for model in (Job, Evaluation, Preflight)
            for row_id in s.scalars(
                model.__table__.select()
                .with_only_columns(model.id)
                .where(model.status == "running")
            )  # fmt: skip
        }


def test_the_turn_goes_to_the_tenant_served_longest_ago(sessions: sessionmaker[Session]) -> None:
    b_tenant = _tenant_of(sessions, make_job(sessions))
    a_tenant = _tenant_of(sessions, make_job(sessions))
    with sessions.begin() as s:  # the helpers' own jobs leave the queue
        s.execute(update(Job).values(status="cancelled"))
    queue = new_id("q")  # this test's own queue
    b = _queued(sessions, b_tenant, 10, queue)  # b queued first, all three kinds
    a = _queued(sessions, a_tenant, 1, queue)
    with sessions() as s:  # nobody served yet: oldest first
        assert turns.order(s, queue, 1)[:2] == [("job", b["job"]), ("evaluation", b["evaluation"])]
    with sessions.begin() as s:
        turns.mark_served(s, b_tenant, queue)
    with sessions() as s:  # b just had a device: a's oldest goes first, then b's
        order = turns.order(s, queue, 1)
    assert order == [(kind, a[kind]) for kind in a] + [(kind, b[kind]) for kind in b]
    with sessions() as s:  # a multi-device queue holds only jobs of its device count
        assert turns.order(s, queue, 2) == []
        assert turns.order(s, new_id("q"), 1) == []


@pytest.mark.usefixtures("scoped")
def test_each_message_runs_whose_turn_it_is(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "session_scope", kinds.session_scope)  # the job's claim too
    b_tenant = _tenant_of(sessions, make_job(sessions))
    a_tenant = _tenant_of(sessions, make_job(sessions))
    with sessions.begin() as s:
        s.execute(update(Job).values(status="cancelled"))
    queue = new_id("q")
    b = _queued(sessions, b_tenant, 10, queue)
    a = _queued(sessions, a_tenant, 1, queue)
    ran: list[str] = []
    # Each message names one of b's rows (b queued them first), as FIFO order would run them.
    for kind in ("pre-flight", "evaluation", "job", "pre-flight", "evaluation", "job"):
        source = b if len(ran) < 3 else a
        before = _claimed(sessions)
        kinds.supervise_turn(kinds.KINDS[kind], source[kind], EXITS)
        ran += sorted(_claimed(sessions) - before)
    assert ran == [b["job"], a["job"], b["evaluation"], a["evaluation"], b["pre-flight"],
                   a["pre-flight"]]  # fmt: skip
    kinds.supervise_turn(kinds.JOB, b["job"], EXITS)  # a message with nothing left: a no-op
    assert len(_claimed(sessions)) == 6
