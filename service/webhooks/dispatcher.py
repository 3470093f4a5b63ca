"""The dispatcher: claims due outbox rows, POSTs them signed, records each outcome.

Each delivery is sent on its own as soon as a sender is free, within one total deadline
(`send`), and at most GRPO_WEBHOOK_TARGET_CONCURRENCY of one webhook's at once (`claim`): a
slow receiver holds its own deliveries, never another's.

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
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import anyio
import anyio.to_thread
import httpx
from anyio.abc import TaskGroup
from sqlalchemy import Row, delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.db import get_sessionmaker
from service.models import Webhook, WebhookDelivery
from service.models.base import utcnow
from service.secrets import crypto
from service.settings import Settings
from service.webhooks import signing, targets
from service.webhooks.service import secret_name

log = logging.getLogger(__name__)


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


def claim(
    session: Session, settings: Settings, limit: int, in_flight: Mapping[str, int] | None = None
) -> list[Attempt]:
    """Lease up to `limit` due deliveries to this dispatcher, counting the attempt, at most
    GRPO_WEBHOOK_TARGET_CONCURRENCY per webhook with those `in_flight` (webhook id -> sends
    under way here): the webhooks due longest first, so that one webhook's backlog never takes
    every sender. Each webhook's rows are leased by one UPDATE whose WHERE re-checks that they
    are still due (a row another dispatcher leased meanwhile is passed by); on PostgreSQL they
    are picked `FOR UPDATE SKIP LOCKED`, so concurrent dispatchers get disjoint rows."""
    in_flight = in_flight or {}
    cap = settings.webhook_target_concurrency
    now = utcnow()
    D = WebhookDelivery
    full = [webhook for webhook, sends in in_flight.items() if sends >= cap]
    due_webhooks = session.scalars(
        select(D.webhook_id)
        .where(D.status == "pending", D.next_attempt_at <= now, D.webhook_id.not_in(full))
        .group_by(D.webhook_id)
        .order_by(func.min(D.next_attempt_at))
        .limit(limit)
    ).all()
    lease = timedelta(seconds=2 * settings.webhook_timeout_s + 30)
    rows: list[Row[str, int, datetime, str, str]] = []  # id, attempts, created, body, hook
    for webhook_id in due_webhooks:
        room = min(cap - in_flight.get(webhook_id, 0), limit - len(rows))
        if room <= 0:
            continue
        due = (
            select(D.id)
            .where(D.webhook_id == webhook_id, D.status == "pending", D.next_attempt_at <= now)
            .order_by(D.next_attempt_at)
            .limit(room)
            .with_for_update(skip_locked=True)
        )
        rows += session.execute(
            update(D)
            .where(D.id.in_(due), D.status == "pending", D.next_attempt_at <= now)
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


async def send(http: httpx.AsyncClient, settings: Settings, attempt: Attempt) -> Outcome:
    """One signed POST to the checked address (DNS answers re-checked now: rebinding), within
    one total deadline of GRPO_WEBHOOK_TIMEOUT_S from connecting to the status line (httpx's
    timeouts are per read: a receiver trickling a header line at a time would pass them all)."""
    try:
        target = await anyio.to_thread.run_sync(
            targets.resolve, attempt.url, settings.webhook_allow_private
        )
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
    with anyio.move_on_after(settings.webhook_timeout_s):
        try:
            async with http.stream(
                "POST",
                url.copy_with(host=target.address),
                content=attempt.body.encode(),
                headers=headers,
                extensions=extensions,
            ) as response:  # the body is never read: a receiver cannot make us hold much
                return Outcome(response.status_code, None if response.is_success else "not 2xx")
        except httpx.HTTPError as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:500])
    return Outcome(None, f"no answer within {settings.webhook_timeout_s:g} s")


class Dispatcher:
    """Sends deliveries as they come due, each on its own (no batch waits for its slowest):
    GRPO_WEBHOOK_CONCURRENCY at once, at most GRPO_WEBHOOK_TARGET_CONCURRENCY per webhook, so a
    slow receiver holds only its own deliveries, each to its deadline."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session] | None = None) -> None:
        self.settings = settings
        self.sessions = sessions or get_sessionmaker()
        self.http = httpx.AsyncClient(
            timeout=settings.webhook_timeout_s,
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment: we connect to what we checked
            limits=httpx.Limits(max_connections=settings.webhook_concurrency),
        )
        self.in_flight: Counter[str] = Counter()  # webhook id -> sends under way
        self.freed: anyio.Event  # set when a send ends (room for a claim); made in its loop

    def _claim(self, limit: int, in_flight: dict[str, int]) -> list[Attempt]:
        with self.sessions.begin() as session:
            return claim(session, self.settings, limit, in_flight)

    def _record(self, attempt: Attempt, outcome: Outcome) -> None:
        with self.sessions.begin() as session:
            record(session, self.settings, attempt, outcome)

    async def _deliver(self, attempt: Attempt) -> None:
        try:
            outcome = await send(self.http, self.settings, attempt)
            await anyio.to_thread.run_sync(self._record, attempt, outcome)
        except Exception:  # the row comes due again when its lease ends
            log.exception("webhook delivery %s failed", attempt.delivery_id)
        finally:
            self.in_flight[attempt.webhook_id] -= 1
            if self.in_flight[attempt.webhook_id] <= 0:
                del self.in_flight[attempt.webhook_id]
            self.freed.set()

    async def claim_and_start(self, tasks: TaskGroup) -> int:
        """Claim what the free senders can take and start sending it; returns how many."""
        free = self.settings.webhook_concurrency - self.in_flight.total()
        if free <= 0:
            return 0
        attempts = await anyio.to_thread.run_sync(self._claim, free, dict(self.in_flight))
        for attempt in attempts:
            self.in_flight[attempt.webhook_id] += 1
            tasks.start_soon(self._deliver, attempt)
        return len(attempts)

    async def serve(self, stop: threading.Event) -> None:
        """Until `stop` is set; then the sends under way finish (each within its deadline)."""
        try:
            async with anyio.create_task_group() as tasks:
                while not stop.is_set():
                    self.freed = anyio.Event()
                    try:
                        busy = await self.claim_and_start(tasks) > 0
                    except Exception:
                        log.exception("webhook dispatch pass failed")
                        busy = False
                    if not busy:  # idle or every sender taken: a poll later, or a send ends
                        with anyio.move_on_after(self.settings.webhook_poll_s):
                            await self.freed.wait()
        finally:
            await self.http.aclose()


def run_forever(settings: Settings, stop: threading.Event) -> None:
    """The dispatcher loop, run beside every reconciler; errors are logged, never fatal."""
    anyio.run(Dispatcher(settings).serve, stop)
