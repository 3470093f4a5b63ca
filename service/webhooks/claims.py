"""Claiming due deliveries for the dispatcher, in tenant turns.

A free sender goes to the tenant with the fewest sends under way in this dispatcher, ties to
the one served longest ago; within a tenant, to its webhook with the fewest under way, ties
likewise. One row per turn, round robin, at most GRPO_WEBHOOK_TENANT_CONCURRENCY per tenant and
GRPO_WEBHOOK_TARGET_CONCURRENCY per webhook. A tenant with nothing under way therefore takes
the next free sender whatever backlog another tenant has queued: another tenant's slow
receivers delay it by one send's deadline at most (docs/webhooks.md states the bound).

A claim leases a row before anything is sent: it counts the attempt and moves
`next_attempt_at` past the attempt's deadline, and is committed. The due webhooks are found by
an index probe per webhook (`ix_webhook_deliveries_webhook_due`), never by scanning a backlog,
so a tenant that queues a million deliveries slows no claim. On PostgreSQL rows are picked
`FOR UPDATE SKIP LOCKED`, so concurrent dispatchers get disjoint rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any, cast

from sqlalchemy import CursorResult, Row, bindparam, delete, exists, select, update
from sqlalchemy.orm import Session

from service.models import Webhook, WebhookDelivery
from service.models.base import utcnow
from service.settings import Settings

D, W = WebhookDelivery, Webhook


@dataclass(frozen=True)
class Attempt:
    delivery_id: str
    number: int  # the row's `attempts` once claimed: the outcome is written only for it
    created_at: datetime
    body: str
    url: str
    tenant_id: str
    webhook_id: str
    sealed_secret: bytes


@dataclass
class Busy:
    """Sends under way in one dispatcher, per tenant and per webhook."""

    tenants: Counter[str] = field(default_factory=Counter)
    webhooks: Counter[str] = field(default_factory=Counter)

    def start(self, attempt: Attempt) -> None:
        self.tenants[attempt.tenant_id] += 1
        self.webhooks[attempt.webhook_id] += 1

    def end(self, attempt: Attempt) -> None:
        for counter, key in (
            (self.tenants, attempt.tenant_id),
            (self.webhooks, attempt.webhook_id),
        ):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

    def total(self) -> int:
        return self.tenants.total()

    def copy(self) -> Busy:
        return Busy(Counter(self.tenants), Counter(self.webhooks))


@dataclass
class Turns:
    """When each tenant and webhook was last given a sender (a turn number, 0: never)."""

    last: dict[str, int] = field(default_factory=dict)
    _clock: count[int] = field(default_factory=lambda: count(1))

    def served(self, *ids: str) -> None:
        turn = next(self._clock)
        self.last.update(dict.fromkeys(ids, turn))

    def keep_only(self, ids: set[str]) -> None:
        """Forget what has nothing due: served long ago or never, it ranks first either way."""
        self.last = {k: v for k, v in self.last.items() if k in ids}


_DUE_WEBHOOKS = select(W.id, W.tenant_id).where(
    exists().where(
        D.webhook_id == W.id, D.status == "pending", D.next_attempt_at <= bindparam("now")
    )
)


def _lease_one(session: Session, webhook_id: str, now: datetime, lease: timedelta) -> Row | None:
    """The webhook's row due longest, leased (None: nothing due, or another claim holds it)."""
    due = (
        select(D.id)
        .where(D.webhook_id == webhook_id, D.status == "pending", D.next_attempt_at <= now)
        .order_by(D.next_attempt_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    # `=` a scalar subquery, run once: under `IN (...)` PostgreSQL may run a SKIP LOCKED
    # subquery again per row and update more rows than its LIMIT.
    return session.execute(
        update(D)
        .where(D.id == due.scalar_subquery(), D.status == "pending", D.next_attempt_at <= now)
        .values(attempts=D.attempts + 1, last_attempt_at=now, next_attempt_at=now + lease)
        .returning(D.id, D.attempts, D.created_at, D.body, D.webhook_id)
        .execution_options(synchronize_session=False)
    ).one_or_none()


def claim(
    session: Session,
    settings: Settings,
    limit: int,
    busy: Busy | None = None,
    turns: Turns | None = None,
) -> list[Attempt]:
    """Lease up to `limit` due deliveries to this dispatcher (with `busy` sends under way here),
    in tenant turns; `turns` is updated with who was served."""
    busy = busy.copy() if busy else Busy()
    turns = turns if turns is not None else Turns()
    tenant_cap, hook_cap = settings.webhook_tenant_concurrency, settings.webhook_target_concurrency
    now = utcnow()
    hooks_of: dict[str, list[str]] = {}
    for webhook_id, tenant_id in session.execute(_DUE_WEBHOOKS, {"now": now}):
        hooks_of.setdefault(tenant_id, []).append(webhook_id)
    turns.keep_only({*hooks_of, *(h for hooks in hooks_of.values() for h in hooks)})

    def rank(key: str, under_way: Counter[str]) -> tuple[int, int]:
        return under_way[key], turns.last.get(key, 0)

    queue = sorted(hooks_of, key=lambda t: rank(t, busy.tenants))
    lease = timedelta(seconds=2 * settings.webhook_timeout_s + 30)
    rows: list[Row] = []
    while queue and len(rows) < limit:
        tenant = queue.pop(0)
        if busy.tenants[tenant] >= tenant_cap:
            continue
        hooks = sorted(
            (h for h in hooks_of[tenant] if busy.webhooks[h] < hook_cap),
            key=lambda h: rank(h, busy.webhooks),
        )
        for webhook_id in hooks:
            if row := _lease_one(session, webhook_id, now, lease):
                rows.append(row)
                busy.tenants[tenant] += 1
                busy.webhooks[webhook_id] += 1
                turns.served(tenant, webhook_id)
                queue.append(tenant)  # its next turn comes after every other tenant's
                break
            hooks_of[tenant].remove(webhook_id)  # nothing left due (or locked by another)
    return _attempts(session, rows)


def _attempts(session: Session, rows: list[Row]) -> list[Attempt]:
    if not rows:
        return []
    hooks = {
        h.id: h for h in session.scalars(select(W).where(W.id.in_({r.webhook_id for r in rows})))
    }
    if orphans := [r.id for r in rows if r.webhook_id not in hooks]:  # deleted meanwhile
        session.execute(delete(D).where(D.id.in_(orphans)))
    return [
        Attempt(
            r.id,
            r.attempts,
            r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC),
            r.body,
            hooks[r.webhook_id].url,
            hooks[r.webhook_id].tenant_id,
            r.webhook_id,
            hooks[r.webhook_id].secret_ciphertext,
        )  # fmt: skip
        for r in rows
        if r.webhook_id in hooks
    ]


def drop_orphans(session: Session) -> int:
    """Delete pending deliveries whose webhook is gone: an event written while its webhook was
    being deleted can leave one, and no claim (which starts from the webhooks) would see it."""
    orphaned = ~exists().where(W.id == D.webhook_id)
    statement = delete(D).where(D.status == "pending", orphaned)
    result = session.execute(statement.execution_options(synchronize_session=False))
    return cast("CursorResult[Any]", result).rowcount or 0
