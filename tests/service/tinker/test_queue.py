"""The Tinker request queue (service/tinker/futures.py) on SQLite and PostgreSQL: a tenant's
requests one at a time and oldest first, tenants in turns weighted by their recent
device-seconds, each claim one conditional UPDATE, the place in the queue a pending future
reports. What a stopped worker left running: test_lease.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import event, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.auth.service import new_api_key
from service.models import Tenant, TinkerRequest
from service.models.base import utcnow
from service.tinker import futures, polling

WINDOW_S = 600.0


def tenants(db: Session, *names: str) -> list[str]:
    ids = []
    for name in names:
        new_api_key(db, name)
        ids.append(db.scalar(select(Tenant.id).where(Tenant.name == name)))
    return ids


def queue(db: Session, tenant: str, n: int) -> list[TinkerRequest]:
    return [futures.submit(db, tenant, "forward_backward", "tiny", {"i": i}) for i in range(n)]


def claim(db: Session, worker: str = "w1") -> TinkerRequest | None:
    return futures.claim_next(db, worker, lease_seconds=60, window_seconds=WINDOW_S)


def run(db: Session, tenant: str, device_seconds: float, ago_s: float = 0.0) -> None:
    """A request of the tenant's that ran `device_seconds` and finished `ago_s` ago."""
    row = futures.submit(db, tenant, "forward_backward", "tiny", {})
    db.execute(
        update(TinkerRequest)
        .where(TinkerRequest.seq == row.seq)
        .values(
            status="done",
            device_seconds=device_seconds,
            finished_at=utcnow() - timedelta(seconds=ago_s),
        )  # fmt: skip
    )


@contextmanager
def statements(db: Session) -> Iterator[list[str]]:
    """The SQL statements `db`'s connection sends meanwhile."""
    sent: list[str] = []
    engine = db.get_bind()

    def record(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        sent.append(sql.lstrip().split(None, 1)[0].upper())

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_tenants_take_turns_and_each_runs_one_request_at_a_time(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as db:
        a, b = tenants(db, "queue-a", "queue-b")
        a1, a2, a3 = (r.id for r in queue(db, a, 3))
        (b1,) = (r.id for r in queue(db, b, 1))
    order = []
    with sessions.begin() as db:  # a's first request runs: b's is next, then nothing
        first, second = claim(db, "w1"), claim(db, "w2")
        assert (first.id, second.id) == (a1, b1)
        assert claim(db, "w3") is None
        for row in (first, second):
            order.append(row.id)
            futures.finish(db, row.seq, result={"ok": True}, device_seconds=0.5)
    while True:
        with sessions.begin() as db:
            row = claim(db)
            if row is None:
                break
            order.append(row.id)
            futures.finish(db, row.seq, error={"error": "x", "category": "user"})
    assert order == [a1, b1, a2, a3]
    with sessions() as db:
        done = {r.id: r.status for r in db.scalars(select(TinkerRequest))}
        assert done == {a1: "done", b1: "done", a2: "failed", a3: "failed"}


def test_a_pending_future_says_where_it_stands(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as db:
        a, b = tenants(db, "place-a", "place-b")
        a_rows = queue(db, a, 3)
        b_rows = queue(db, b, 1)
        # each counts its own tenant's requests ahead of it, never the other tenant's
        assert futures.queue_position(db, b_rows[0]) == 0
        assert futures.queue_position(db, a_rows[2]) == 2
        answer = polling.answer((a_rows[2], 2), protobuf=True)
        body = json.loads(answer.body)
        assert body["type"] == "try_again" and body["queue_position"] == 2
        assert body["queue_state"] == "active"
        assert body["queue_state_reason"] == "queued, 2 of yours ahead"
        seqs = [row.seq for row in a_rows + b_rows]  # leave nothing queued for the other tests
        db.execute(update(TinkerRequest).where(TinkerRequest.seq.in_(seqs)).values(status="failed"))


def test_the_next_turn_is_the_tenant_that_used_the_least_lately(
    sessions: sessionmaker[Session],
) -> None:
    """Not the tenant served longest ago: the one whose requests took the fewest device-seconds
    in the window, so a tenant of small requests goes before a queue of another's big ones.
    What finished before the window does not count."""
    with sessions.begin() as db:
        light, heavy, middle = tenants(db, "cost-light", "cost-heavy", "cost-middle")
        run(db, light, 1000.0, ago_s=2 * WINDOW_S)  # long ago: forgotten
        run(db, light, 0.2)
        run(db, middle, 5.0)
        run(db, heavy, 30.0)
        heavy_next = queue(db, heavy, 2)  # queued first: the oldest heads
        (middle_next,) = queue(db, middle, 1)
        light_next = queue(db, light, 2)
    with sessions.begin() as db:
        got = [claim(db, f"w{i}") for i in range(4)]
        # one request a tenant at a time: light's second waits for its first
        assert [r.id if r else None for r in got] == [
            light_next[0].id,
            middle_next.id,
            heavy_next[0].id,
            None,
        ]
        futures.finish(db, got[0].seq, result={}, device_seconds=100.0)  # light is heavy now
        futures.finish(db, got[2].seq, result={}, device_seconds=1.0)
    with sessions.begin() as db:  # heavy (31 s) before light (100.2 s); middle still runs
        assert claim(db).id == heavy_next[1].id
        assert claim(db).id == light_next[1].id
        assert claim(db) is None


def test_a_claim_is_one_conditional_update(sessions: sessionmaker[Session]) -> None:
    """The choice and the claim are one statement: nothing read before it, one UPDATE, then
    the claimed row read back. A request another claim took is not taken again."""
    with sessions.begin() as db:
        (tenant,) = tenants(db, "one-update")
        (queued,) = queue(db, tenant, 1)
    with sessions.begin() as db, statements(db) as sent:
        row = claim(db)
        assert row is not None and row.id == queued.id and row.status == "running"
        assert sent == ["UPDATE", "SELECT"]
    with sessions.begin() as db, statements(db) as sent:
        assert claim(db) is None
        assert sent == ["UPDATE"]
        futures.finish(db, row.seq, result={})


def test_an_idle_look_is_one_read(sessions: sessionmaker[Session]) -> None:
    """What an idle worker asks before it tries a claim: one SELECT and no UPDATE (on SQLite
    every UPDATE takes the database's write lock, and an idle worker looks twice a second);
    true once a request of the worker's bases waits, false again once it is claimed."""
    with sessions.begin() as db, statements(db) as sent:
        assert not futures.any_queued(db, ["idle-look"])
        assert sent == ["SELECT"]
    with sessions.begin() as db:
        (tenant,) = tenants(db, "idle-look")
        futures.submit(db, tenant, "forward_backward", "idle-look", {})
    with sessions.begin() as db:
        assert futures.any_queued(db, ["idle-look"]) and not futures.any_queued(db, ["other"])
        row = futures.claim_next(db, "w1", ["idle-look"], lease_seconds=60, window_seconds=60)
        assert row is not None and row.base_model == "idle-look"
        assert not futures.any_queued(db, ["idle-look"])
