"""The outbox and the dispatcher's database side, on SQLite and PostgreSQL: a delivery is
written with the event it announces (and rolled back with it), claims never overlap, retries
back off and stop; a private target is refused at send time too."""

from __future__ import annotations

import secrets
from datetime import timedelta

import anyio
import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.jobs import lifecycle
from service.models import Dataset, Job, Tenant, Webhook, WebhookDelivery
from service.models.base import utcnow
from service.settings import Settings
from service.webhooks import claims, dispatcher

SETTINGS = Settings(webhook_retry_base_s=10, webhook_max_attempts=3)


def _tenant_with_job(session: Session, events: list[str]) -> tuple[str, str]:
    tenant, job = f"ten_{secrets.token_hex(4)}", f"job_{secrets.token_hex(4)}"
    session.add(Tenant(id=tenant, name=tenant))
    session.flush()  # no ORM relationships: the rows go in one table at a time
    session.add(Dataset(id=f"ds_{tenant}", tenant_id=tenant, name="d", num_records=1,
                        sha256="x", object_key="k"))  # fmt: skip
    session.flush()
    session.add(Webhook(id=f"wh_{tenant}", tenant_id=tenant, url="https://93.184.215.14/h",
                        events=events, secret_ciphertext=b"x"))  # fmt: skip
    session.flush()
    lifecycle.create(session, Job(id=job, tenant_id=tenant, dataset_id=f"ds_{tenant}", spec={},
                                  total_steps=1))  # fmt: skip
    return tenant, job


def _deliveries(session: Session, tenant: str) -> list[WebhookDelivery]:
    stmt = select(WebhookDelivery).where(WebhookDelivery.tenant_id == tenant)
    return list(session.scalars(stmt.order_by(WebhookDelivery.id)))


def test_an_event_and_its_deliveries_commit_together(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        tenant, job = _tenant_with_job(s, ["job.queued", "job.checkpoint"])
        other, _ = _tenant_with_job(s, ["job.succeeded"])  # not subscribed to job.queued
    with sessions.begin() as s:
        lifecycle.add_event(s, job, "checkpoints_pruned", "not announced", {})
        lifecycle.add_event(s, job, "checkpoint", "checkpoint at step 2", {"step": 2})
    with sessions() as s:
        s.begin()
        lifecycle.add_event(s, job, "checkpoint", "rolled back", {"step": 4})
        s.flush()
        s.rollback()
    with sessions() as s:
        rows = _deliveries(s, tenant)
        assert [r.event_type for r in rows] == ["job.queued", "job.checkpoint"]
        assert '"step":2' in rows[1].body and all(r.status == "pending" for r in rows)
        assert _deliveries(s, other) == []


def test_claims_never_overlap_and_retries_stop(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        tenant, _ = _tenant_with_job(s, ["*"])
        s.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.tenant_id != tenant)
            .values(status="delivered")
        )  # fmt: skip  (earlier tests' rows)
    with sessions.begin() as first:
        (mine,) = claims.claim(first, SETTINGS, 10)
        if first.bind.dialect.name == "postgresql":  # meanwhile: SKIP LOCKED passes it by
            with sessions.begin() as second:
                assert claims.claim(second, SETTINGS, 10) == []
    with sessions.begin() as s:  # leased to the first for the attempt's timeout and more
        assert claims.claim(s, SETTINGS, 10) == []
    assert mine.number == 1
    for number, expected in [(1, "pending"), (2, "pending"), (3, "failed")]:
        attempt = claims.Attempt(**{**mine.__dict__, "number": number})
        with sessions.begin() as s:
            s.execute(update(WebhookDelivery).where(WebhookDelivery.id == mine.delivery_id)
                      .values(attempts=number))  # fmt: skip
            dispatcher.record(s, SETTINGS, attempt, dispatcher.Outcome(500, "not 2xx"))
        with sessions() as s:
            row = s.get(WebhookDelivery, mine.delivery_id)
            assert row is not None and row.status == expected and row.last_status_code == 500
            if expected == "pending":  # 10 s, doubled per retry, half of it random
                delay = row.next_attempt_at.replace(tzinfo=None) - utcnow().replace(tzinfo=None)
                assert timedelta(seconds=2.5 * 2 ** (number - 1)) < delay
                assert delay <= timedelta(seconds=10 * 2 ** (number - 1))


@pytest.mark.parametrize("url", ["https://localhost/h", "https://[::ffff:169.254.169.254]/h"])
def test_a_private_target_is_refused_at_send_time(url: str) -> None:
    attempt = claims.Attempt("msg_x", 1, utcnow(), "{}", url, "ten_x", "wh_x", b"")

    async def send() -> dispatcher.Outcome:
        transport = httpx.MockTransport(lambda _: pytest.fail("sent"))
        async with httpx.AsyncClient(transport=transport) as http:
            return await dispatcher.send(http, Settings(), attempt)

    outcome = anyio.run(send)
    assert outcome.status_code is None and "not a public address" in (outcome.error or "")
