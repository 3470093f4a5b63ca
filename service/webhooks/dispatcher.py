"""The dispatcher: claims due outbox rows in tenant turns (`claims`), POSTs them signed,
records each outcome.

Each delivery is sent on its own as soon as a sender is free, within one total deadline
(`send`). Senders are handed out in tenant turns, at most GRPO_WEBHOOK_TENANT_CONCURRENCY of one
tenant's and GRPO_WEBHOOK_TARGET_CONCURRENCY of one webhook's at once: a slow receiver holds its
own deliveries, and its tenant's, never another tenant's for more than one send's deadline.

At-least-once: a claim moves the row's `next_attempt_at` past the attempt's timeout and counts
the attempt before anything is sent, then commits; the outcome is written after. A dispatcher
that dies mid-send leaves the row to come due again (the same `webhook-id`), so a receiver may
see a message twice and must deduplicate by `webhook-id`, never see it zero times; one that is
stopped claims nothing more and finishes (and records) the sends under way. Nothing is held
in memory between a claim and its send, so a restart loses nothing. Many dispatchers may run
(one beside each reconciler): `FOR UPDATE SKIP LOCKED` hands each row to one of them (SQLite
has one writer at a time anyway), and an outcome is written only by the attempt that claimed it.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import anyio.to_thread
import httpx
from anyio.abc import TaskGroup
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.core.db import get_sessionmaker
from service.models import WebhookDelivery
from service.models.base import utcnow
from service.secrets import crypto
from service.settings import Settings
from service.webhooks import signing, targets
from service.webhooks.claims import Attempt, Busy, Turns, claim, drop_orphans
from service.webhooks.service import secret_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


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


def http_client(settings: Settings) -> httpx.AsyncClient:
    """The senders' client. httpx's own connect timeout, shorter than the attempt's deadline,
    ends a slow connect or TLS handshake and closes its socket. It bounds each phase on its
    own (TCP, then TLS), so on a loaded machine the attempt's deadline (`send`) may come first:
    mid-handshake `send` closes the socket itself (`UnownedStream`); later, httpx closes the
    connection it was reading. One pooled connection per sender, so no send waits for the
    pool."""
    senders = settings.webhook_concurrency
    return httpx.AsyncClient(
        timeout=httpx.Timeout(
            settings.webhook_timeout_s, connect=settings.webhook_connect_timeout_s
        ),
        limits=httpx.Limits(max_connections=senders, max_keepalive_connections=senders),
        follow_redirects=False,
        trust_env=False,  # no proxy from the environment: we connect to what we checked
    )


class UnownedStream:
    """httpcore's `trace` extension, kept to close a connection that httpcore has not yet made
    its own. A TCP connection whose TLS handshake is cut by the deadline is never closed by
    httpcore (its `start_tls` closes the socket on an Exception only, and a cancellation is not
    one): it would stay open, its receiver's slot and our file descriptor held, until the
    garbage collector finds it. Between `connect_tcp` and the end of the handshake the stream
    is ours to close; once the handshake completes, or a request is sent, httpcore's."""

    def __init__(self) -> None:
        self.stream: Any = None

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self.stream = info["return_value"]
        elif not event.startswith("connection.start_tls.") or event.endswith(".complete"):
            self.stream = None

    async def close(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            await stream.aclose()


async def send(http: httpx.AsyncClient, settings: Settings, attempt: Attempt) -> Outcome:
    """One signed POST to the checked address (DNS answers re-checked now: rebinding): the
    lookup within GRPO_WEBHOOK_CONNECT_TIMEOUT_S, then one total deadline of
    GRPO_WEBHOOK_TIMEOUT_S from connecting to the status line (httpx's timeouts are per read: a
    receiver trickling a header line at a time would pass them all)."""
    resolve = functools.partial(targets.resolve, attempt.url, settings.webhook_allow_private)
    target: targets.Target | None = None
    # The name's DNS server may be the tenant's own: bounded. A lookup cannot be interrupted;
    # one past the bound is left to finish in its thread.
    with anyio.move_on_after(settings.webhook_connect_timeout_s):
        try:
            target = await anyio.to_thread.run_sync(resolve, abandon_on_cancel=True)
        except targets.TargetRefused as exc:
            return Outcome(None, str(exc))
    if target is None:
        return Outcome(None, f"no DNS answer within {settings.webhook_connect_timeout_s:g} s")
    try:
        secret = crypto.decrypt(
            settings, attempt.tenant_id, secret_name(attempt.webhook_id), attempt.sealed_secret
        )
    except crypto.SecretsUnavailable as exc:
        return Outcome(None, f"cannot sign: {exc}")
    headers = signing.headers(secret, attempt.delivery_id, int(time.time()), attempt.body)
    url = target.url
    headers["host"] = url.netloc.decode("ascii")
    unowned = UnownedStream()
    extensions: dict[str, Any] = {"trace": unowned}
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
            ) as response:  # the body is never read; leaving closes it, freeing the connection
                return Outcome(response.status_code, None if response.is_success else "not 2xx")
        except httpx.ConnectTimeout:  # httpx closed the socket it was connecting
            return Outcome(None, f"no connection within {settings.webhook_connect_timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:500])
    await unowned.close()  # cut mid-handshake (or right after connecting)
    return Outcome(None, f"no answer within {settings.webhook_timeout_s:g} s")


@dataclass
class Dispatcher:
    """Sends deliveries as they come due, each on its own (no batch waits for its slowest):
    GRPO_WEBHOOK_CONCURRENCY at once, handed out in tenant turns (`claims`)."""

    settings: Settings
    sessions: sessionmaker[Session] = field(default_factory=get_sessionmaker)
    busy: Busy = field(default_factory=Busy)
    turns: Turns = field(default_factory=Turns)
    freed: anyio.Event = field(init=False)  # a send ended (room for a claim); made in its loop

    def __post_init__(self) -> None:
        self.http = http_client(self.settings)

    def _claim(self, limit: int, busy: Busy) -> list[Attempt]:
        with self.sessions.begin() as session:
            return claim(session, self.settings, limit, busy, self.turns)

    def _record(self, attempt: Attempt, outcome: Outcome) -> None:
        with self.sessions.begin() as session:
            record(session, self.settings, attempt, outcome)

    def _drop_orphans(self) -> None:
        with self.sessions.begin() as session:
            if dropped := drop_orphans(session):
                log.info("dropped %d deliveries of deleted webhooks", dropped)

    async def _deliver(self, attempt: Attempt) -> None:
        try:
            outcome = await send(self.http, self.settings, attempt)
            await anyio.to_thread.run_sync(self._record, attempt, outcome)
        except Exception:  # the row comes due again when its lease ends
            log.exception("webhook delivery %s failed", attempt.delivery_id)
        finally:
            self.busy.end(attempt)
            self.freed.set()

    async def claim_and_start(self, tasks: TaskGroup) -> int:
        """Claim what the free senders can take and start sending it; returns how many."""
        free = self.settings.webhook_concurrency - self.busy.total()
        if free <= 0:
            return 0
        attempts = await anyio.to_thread.run_sync(self._claim, free, self.busy.copy())
        for attempt in attempts:
            self.busy.start(attempt)
            tasks.start_soon(self._deliver, attempt)
        return len(attempts)

    async def serve(self, stop: threading.Event) -> None:
        """Until `stop` is set; then the sends under way finish (each within its deadline) and
        are recorded: nothing claimed is left behind."""
        try:
            await anyio.to_thread.run_sync(self._drop_orphans)
        except Exception:
            log.exception("dropping orphaned webhook deliveries failed")
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
