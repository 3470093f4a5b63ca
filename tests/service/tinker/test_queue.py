"""The Tinker request queue (service/tinker/futures.py) on SQLite and PostgreSQL: a tenant's
requests one at a time and oldest first, tenants in turn, each claim taken once, the place in
the queue a pending future reports. What a stopped worker left running: test_lease.py."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.auth.service import new_api_key
from service.models import Tenant, TinkerRequest
from service.tinker import futures, polling


def tenants(db: Session, *names: str) -> list[str]:
    ids = []
    for name in names:
        new_api_key(db, name)
        ids.append(db.scalar(select(Tenant.id).where(Tenant.name == name)))
    return ids


def queue(db: Session, tenant: str, n: int) -> list[TinkerRequest]:
    return [futures.submit(db, tenant, "forward_backward", "tiny", {"i": i}) for i in range(n)]


def test_tenants_take_turns_and_each_runs_one_request_at_a_time(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as db:
        a, b = tenants(db, "queue-a", "queue-b")
        a1, a2, a3 = (r.id for r in queue(db, a, 3))
        (b1,) = (r.id for r in queue(db, b, 1))
    served: dict[str, float] = {}
    order = []
    with sessions.begin() as db:  # a's first request runs: b's is next, then nothing
        first = futures.claim_next(db, "w1", served, lease_seconds=60)
        second = futures.claim_next(db, "w2", served, lease_seconds=60)
        assert (first.id, second.id) == (a1, b1)
        assert futures.claim_next(db, "w3", served, lease_seconds=60) is None
        for i, row in enumerate((first, second)):
            served[row.tenant_id] = i
            order.append(row.id)
            futures.finish(db, row.seq, result={"ok": True}, device_seconds=0.5)
    while True:
        with sessions.begin() as db:
            row = futures.claim_next(db, "w1", served, lease_seconds=60)
            if row is None:
                break
            served[row.tenant_id] = len(order)
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
        for row in a_rows + b_rows:  # leave nothing queued for the other tests
            futures.finish(db, row.seq, error={"error": "done", "category": "user"})
