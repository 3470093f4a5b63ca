"""An evaluation row's transitions on SQLite and PostgreSQL: claim under a lease, renew and
fence by epoch, cancel in each state, the outcome metering the claim's device time, and the
reconciler's expiry (back to queued, failed after max_attempts, cancelling -> cancelled)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.core.ids import new_id
from service.core.leases import LeaseLost
from service.evaluations import rows
from service.models import Evaluation, Tenant
from service.models.base import utcnow
from service.settings import Settings
from service.training.reconciler import reconcile_rows


def _new(sessions: sessionmaker[Session]) -> str:
    with sessions() as s:
        tenant = Tenant(id=new_id("t"), name=new_id("tenant"))
        s.add(tenant)
        s.flush()
        row = Evaluation(
            id=new_id("eval"), tenant_id=tenant.id, queue="gpu", model="m", base_model="m",
            spec={}, status="queued",
        )  # fmt: skip
        s.add(row)
        s.commit()
        return row.id


def _get(sessions: sessionmaker[Session], eval_id: str) -> Evaluation:
    with sessions() as s:
        return s.get_one(Evaluation, eval_id)


def test_claim_renew_cancel_finish(sessions: sessionmaker[Session]) -> None:
    eval_id = _new(sessions)
    with sessions.begin() as s:
        epoch = rows.claim(s, eval_id, 60)
        assert epoch == 1 and rows.claim(s, eval_id, 60) is None  # held: nobody else
    with sessions.begin() as s:
        assert rows.renew(s, eval_id, 1, 60) == "running"
        with pytest.raises(LeaseLost):
            rows.renew(s, eval_id, 2, 60)
    with sessions.begin() as s:
        assert rows.cancel(s, s.get_one(Evaluation, eval_id))
    with sessions.begin() as s:
        assert rows.renew(s, eval_id, 1, 60) == "cancelling"
        assert rows.finish(s, eval_id, 1, {"reward_mean": 1.0}) == "cancelled"
    row = _get(sessions, eval_id)
    assert row.status == "cancelled" and row.results is None and row.finished_at is not None
    assert row.device_seconds >= 0.0
    with sessions.begin() as s:
        assert not rows.cancel(s, s.get_one(Evaluation, eval_id))  # final: nothing to cancel
        assert rows.finish(s, eval_id, 1, {}) is None


def test_outcome_meters_the_claim(sessions: sessionmaker[Session]) -> None:
    eval_id = _new(sessions)
    with sessions.begin() as s:
        epoch = rows.claim(s, eval_id, 60)
        assert epoch is not None
        s.execute(
            update(Evaluation)
            .where(Evaluation.id == eval_id)
            .values(started_at=utcnow() - timedelta(seconds=30))
        )
        rows.add_usage(s, eval_id, tokens=7, device_kind="cpu")
    with sessions.begin() as s:
        assert rows.finish(s, eval_id, epoch, {"reward_mean": 0.5}) == "succeeded"
    row = _get(sessions, eval_id)
    assert row.results == {"reward_mean": 0.5} and 30 <= row.device_seconds < 40
    assert (row.completion_tokens, row.device_kind) == (7, "cpu")


def test_expired_leases(sessions: sessionmaker[Session]) -> None:
    ids = [_new(sessions) for _ in range(3)]
    with sessions.begin() as s:
        for eval_id in ids:
            assert rows.claim(s, eval_id, -1) == 1  # a lease that has already run out
        assert rows.cancel(s, s.get_one(Evaluation, ids[2]))
        back = rows.expire(s, max_attempts=2)
        assert [r.id for r in back] == ids[:2] or {r.id for r in back} == set(ids[:2])
    assert [_get(sessions, i).status for i in ids] == ["queued", "queued", "cancelled"]
    with sessions.begin() as s:
        assert rows.claim(s, ids[0], -1) == 2
        rows.expire(s, max_attempts=2)
    row = _get(sessions, ids[0])
    assert row.status == "failed" and row.error["code"] == "lease_lost"
    with sessions.begin() as s, pytest.raises(LeaseLost):  # a stale epoch writes nothing
        rows.fence(s, ids[1], 1)


def test_reconciler_sends_lost_messages_and_takes_back_leases(
    sessions: sessionmaker[Session],
) -> None:
    settings = Settings(max_attempts=2, requeue_after_seconds=30)
    waiting, fresh, lost = (_new(sessions) for _ in range(3))
    with sessions.begin() as s:
        old = utcnow() - timedelta(seconds=60)
        s.execute(update(Evaluation).where(Evaluation.id == waiting).values(enqueued_at=old))
        assert rows.claim(s, lost, -1) == 1  # its worker died: the lease ran out

    def run(depth: int | None) -> set[str]:
        with sessions.begin() as s:
            return {e.id for e in reconcile_rows(s, settings, lambda _queue: depth, rows)}

    # the queue still holds messages (or cannot tell): only the lost lease comes back
    assert run(3) == {lost}
    assert _get(sessions, lost).status == "queued"
    assert run(None) == set()
    # an empty queue: the long-waiting one's message was lost; `lost` was enqueued just now
    assert run(0) == {waiting}
    assert run(0) == set()  # enqueued again: it waits anew
    assert fresh not in run(0)
