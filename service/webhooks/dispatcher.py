"""The dispatcher: claims due outbox rows, POSTs them signed, records each outcome.

At-least-once: a claim moves the row's `next_attempt_at` past the attempt's timeout and counts
the attempt before anything is sent, then commits; the outcome is written after. A dispatcher
that dies mid-send leaves the row to come due again (the same `webhook-id`), so a receiver may
see a message twice and must deduplicate by `webhook-id`, never see it zero times. Many
dispatchers may run (one beside each reconciler): `FOR UPDATE SKIP LOCKED` hands each row to
one of them (SQLite has one writer at a time anyway), and an outcome is written only by the
attempt that claimed it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from service.core.db import session_scope
from service.models import Webhook, WebhookDelivery
from service.models.base import utcnow
from service.secrets import crypto
from service.settings import Settings
from service.webhooks import signing, targets
from service.webhooks.service import secret_name

log = logging.getLogger(__name__)

BATCH_PER_SENDER = 4  # rows claimed per pass, per concurrent sender


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


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def claim(session: Session, settings: Settings, limit: int) -> list[Attempt]:
    """Lease up to `limit` due deliveries to this dispatcher, counting the attempt. One UPDATE:
    on SQLite it takes the write lock before it reads (no stale read to act on); on PostgreSQL
    the rows are picked `FOR UPDATE SKIP LOCKED`, so concurrent dispatchers get disjoint rows."""
    now = utcnow()
    lease = timedelta(seconds=2 * settings.webhook_timeout_s + 30)
    due = (
        select(WebhookDelivery.id)
        .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    D = WebhookDelivery
    rows = session.execute(
        update(D)
        .where(D.id.in_(due))
        .values(attempts=D.attempts + 1, last_attempt_at=now, next_attempt_at=now + lease)
        .returning(D.id, D.attempts, D.created_at, D.body, D.webhook_id)
        .execution_options(synchronize_session=False)
    ).all()
    if not rows:
        return []
    hooks = {
        h.id: h
        for h in session.scalars(
            select(Webhook).where(Webhook.id.in_({r.webhook_id for r in rows}))
        )
    }
    if orphans := [r.id for r in rows if r.webhook_id not in hooks]:  # deleted meanwhile
        session.execute(delete(D).where(D.id.in_(orphans)))
    return [
        Attempt(
            r.id,
            r.attempts,
            _aware(r.created_at),
            r.body,
            hooks[r.webhook_id].url,
            hooks[r.webhook_id].tenant_id,
            r.webhook_id,
            hooks[r.webhook_id].secret_ciphertext,
        )  # fmt: skip
        for r in rows
        if r.webhook_id in hooks
    ]


def backoff(settings: Settings, attempt: int) -> float:
    """Exponential, capped, half of it random (so retries of many deliveries spread out)."""
    delay = min(settings.webhook_retry_max_s, settings.webhook_retry_base_s * 2 ** (attempt - 1))
    return delay / 2 + random.uniform(0, delay / 2)


def record(session: Session, settings: Settings, attempt: Attempt, outcome: Outcome) -> None:
    now = utcnow()
    values: dict[str, object] = {
        "last_status_code": outcome.status_code,
        "last_error": outcome.error,
    }
    if outcome.delivered:
        values.update(status="delivered", delivered_at=now)
    elif (
        attempt.number >= settings.webhook_max_attempts
        or (now - attempt.created_at).total_seconds() >= settings.webhook_max_age_s
    ):
        values.update(status="failed")
    else:
        values.update(next_attempt_at=now + timedelta(seconds=backoff(settings, attempt.number)))
    session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == attempt.delivery_id,
            WebhookDelivery.attempts == attempt.number,
            WebhookDelivery.status == "pending",
        )
        .values(**values)
    )


def send(http: httpx.Client, settings: Settings, attempt: Attempt) -> Outcome:
    """One signed POST to the checked address (DNS answers re-checked now: rebinding)."""
    try:
        target = targets.resolve(attempt.url, settings.webhook_allow_private)
    except targets.TargetRefused as exc:
        return Outcome(None, str(exc))
    try:
        secret = crypto.decrypt(
            settings, attempt.tenant_id, secret_name(attempt.webhook_id), attempt.sealed_secret
        )
    except crypto.SecretsUnavailable as exc:
        return Outcome(None, f"cannot sign: {exc}")
    headers = signing.headers(secret, attempt.delivery_id, int(time.time()), attempt.body)
    url = target.url
    headers["host"] = url.netloc.decode("ascii")
    extensions = {}
    if url.scheme == "https" and target.address != url.host:
        extensions["sni_hostname"] = url.host  # TLS and its certificate check: the name
    try:
        with http.stream(
            "POST",
            url.copy_with(host=target.address),
            content=attempt.body.encode(),
            headers=headers,
            extensions=extensions,
        ) as response:  # the body is never read: a receiver cannot make us hold much
            return Outcome(response.status_code, None if response.is_success else "not 2xx")
    except httpx.HTTPError as exc:
        return Outcome(None, f"{type(exc).__name__}: {exc}"[:500])


class Dispatcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.http = httpx.Client(
            timeout=settings.webhook_timeout_s,
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment: we connect to what we checked
            limits=httpx.Limits(max_connections=settings.webhook_concurrency),
        )
        self.pool = ThreadPoolExecutor(settings.webhook_concurrency, "webhook-send")

    def _deliver(self, attempt: Attempt) -> Outcome:
        outcome = send(self.http, self.settings, attempt)
        with session_scope() as session:
            record(session, self.settings, attempt, outcome)
        return outcome

    def run_once(self) -> int:
        """Claim due deliveries and send them; returns how many were attempted."""
        with session_scope() as session:
            attempts = claim(
                session, self.settings, BATCH_PER_SENDER * self.settings.webhook_concurrency
            )
        list(self.pool.map(self._deliver, attempts))
        return len(attempts)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.close()


def run_forever(settings: Settings, stop: threading.Event) -> None:
    """The dispatcher loop, run beside every reconciler; errors are logged, never fatal."""
    dispatcher = Dispatcher(settings)
    try:
        while not stop.is_set():
            try:
                busy = dispatcher.run_once() > 0
            except Exception:
                log.exception("webhook dispatch pass failed")
                busy = False
            if not busy:
                stop.wait(settings.webhook_poll_s)
    finally:
        dispatcher.close()
