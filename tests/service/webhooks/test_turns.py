"""Claims in tenant turns (SQLite and PostgreSQL): a tenant with nothing under way takes the next
free sender ahead of another tenant's older backlog; a tenant never holds more than its share
of senders, and its turns go round its webhooks."""

from __future__ import annotations

import secrets

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.models import Tenant, Webhook, WebhookDelivery
from service.settings import Settings
from service.webhooks import claims

SETTINGS = Settings(webhook_tenant_concurrency=2, webhook_target_concurrency=2)


def _tenant(session: Session, hooks: int) -> tuple[str, list[str]]:
    tenant = f"ten_{secrets.token_hex(4)}"
    session.add(Tenant(id=tenant, name=tenant))
    session.flush()
    ids = [f"wh_{secrets.token_hex(6)}" for _ in range(hooks)]
    for webhook_id in ids:
        session.add(Webhook(id=webhook_id, tenant_id=tenant, url="https://93.184.215.14/h",
                            events=["*"], secret_ciphertext=b"x"))  # fmt: skip
    return tenant, ids


def _queue(sessions: sessionmaker[Session], tenant: str, webhook_id: str, n: int) -> None:
    with sessions.begin() as s:
        for _ in range(n):
            s.add(WebhookDelivery(id=f"msg_{secrets.token_hex(8)}", webhook_id=webhook_id,
                                  tenant_id=tenant, event_type="ping", body="{}"))  # fmt: skip


def test_a_quiet_tenant_goes_before_anothers_backlog(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:  # earlier tests' rows are not this test's business
        s.execute(update(WebhookDelivery).values(status="delivered"))
        flooder, flooder_hooks = _tenant(s, 3)
        quiet, (quiet_hook,) = _tenant(s, 1)
    for webhook_id in flooder_hooks:
        _queue(sessions, flooder, webhook_id, 10)  # due long before the quiet tenant's one
    _queue(sessions, quiet, quiet_hook, 1)
    turns = claims.Turns()

    with sessions.begin() as s:  # one free sender each: one turn per tenant
        first = claims.claim(s, SETTINGS, 2, turns=turns)
    assert sorted(a.tenant_id for a in first) == sorted([flooder, quiet])

    busy = claims.Busy()
    for attempt in first:
        busy.start(attempt)
    with sessions.begin() as s:  # every sender free: the flooder gets its share, no more
        second = claims.claim(s, SETTINGS, 8, busy, turns)
    assert [a.tenant_id for a in second] == [flooder]
    flooders = [a for a in [*first, *second] if a.tenant_id == flooder]
    assert len({a.webhook_id for a in flooders}) == 2  # its turns went round its webhooks

    for attempt in second:
        busy.start(attempt)
    _queue(sessions, quiet, quiet_hook, 1)
    with sessions.begin() as s:
        third = claims.claim(s, SETTINGS, 8, busy, turns)
    assert [a.tenant_id for a in third] == [quiet]


def test_a_delivery_whose_webhook_is_gone_is_dropped(sessions: sessionmaker[Session]) -> None:
    """An event written while its webhook was deleted leaves a row no claim would see."""
    with sessions.begin() as s:
        tenant, (kept,) = _tenant(s, 1)
    _queue(sessions, tenant, kept, 1)
    _queue(sessions, tenant, "wh_deleted_meanwhile", 2)
    with sessions.begin() as s:
        assert claims.drop_orphans(s) == 2
    with sessions() as s:
        rows = s.scalars(select(WebhookDelivery).where(WebhookDelivery.tenant_id == tenant))
        assert [r.webhook_id for r in rows] == [kept]
