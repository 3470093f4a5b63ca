"""A tenant's slow receivers against the dispatcher (PostgreSQL, real HTTP and sockets):

- 300 deliveries to receivers that never answer (half over http, cut at the attempt's
  deadline; half over https, whose TLS handshake never ends, cut by httpx's connect timeout)
  hold another tenant's deliveries for less than the bound of docs/webhooks.md;
- every connection they opened is closed once cut, so the dispatcher still delivers after them;
- the dispatcher restarted mid-way loses nothing: each slow delivery is attempted exactly once,
  recorded and still pending (its retries not spent), and the other tenant's all arrive.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.models import Tenant, Webhook, WebhookDelivery
from service.secrets import crypto
from service.settings import Settings
from service.webhooks import dispatcher
from service.webhooks.service import secret_name
from tests.e2e.webhook_receiver import (
    Receiver,
    closed_without_the_collector,
    run_receiver,
    silent_receiver,
)

DEADLINE_S, CONNECT_S, POLL_S = 0.25, 0.1, 0.1
SETTINGS = Settings(
    webhook_allow_private=True,
    webhook_timeout_s=DEADLINE_S,
    webhook_connect_timeout_s=CONNECT_S,
    webhook_poll_s=POLL_S,
    webhook_concurrency=16,
    webhook_tenant_concurrency=8,
    webhook_retry_base_s=600,  # no retry within the test: each slow delivery is tried once
    secrets_key=SecretStr(Fernet.generate_key().decode()),
)
# docs/webhooks.md: while the slow tenant leaves senders free, the next pass (POLL_S) sends
# the other tenant's delivery; the rest is slack for a loaded test machine.
BOUND_S = POLL_S + 0.9
SLOW_HOOKS, PER_HOOK = 20, 15  # 20 webhooks, the most a tenant has; 300 deliveries

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


@contextmanager
def running(sessions: sessionmaker[Session]) -> Iterator[None]:
    """A dispatcher in a thread; leaving stops it as `grpo-service worker` does (and waits)."""
    stop = threading.Event()
    sender = dispatcher.Dispatcher(SETTINGS, sessions)
    thread = threading.Thread(target=anyio.run, args=(sender.serve, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(DEADLINE_S + CONNECT_S + 10)
        assert not thread.is_alive()


def _tenant(session: Session, urls: list[str]) -> tuple[str, list[str]]:
    tenant = f"ten_{secrets.token_hex(4)}"
    session.add(Tenant(id=tenant, name=tenant))
    session.flush()
    hooks = []
    for url in urls:
        hook = f"wh_{secrets.token_hex(6)}"
        sealed = crypto.encrypt(SETTINGS, tenant, secret_name(hook), "whsec_test")
        session.add(Webhook(id=hook, tenant_id=tenant, url=url, events=["*"],
                            secret_ciphertext=sealed))  # fmt: skip
        hooks.append(hook)
    return tenant, hooks


def _queue(sessions: sessionmaker[Session], tenant: str, hook: str, n: int = 1) -> list[str]:
    ids = [f"msg_{secrets.token_hex(8)}" for _ in range(n)]
    with sessions.begin() as s:
        for message in ids:
            s.add(WebhookDelivery(id=message, webhook_id=hook, tenant_id=tenant,
                                  event_type="ping", body="{}"))  # fmt: skip
    return ids


def _within(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "not within the time allowed"
        time.sleep(0.02)
    return time.monotonic() - start


def _arrives(fast: Receiver, message: str) -> Callable[[], bool]:
    return lambda: any(r.headers.get("webhook-id") == message for r in fast.got())


def _attempted(sessions: sessionmaker[Session], tenant: str) -> int:
    """The tenant's deliveries tried and their outcome recorded."""
    D = WebhookDelivery
    with sessions() as s:
        stmt = select(func.count()).where(D.tenant_id == tenant, D.last_error.is_not(None))
        return s.scalar(stmt) or 0


def test_slow_receivers_hold_only_their_tenant(sessions: sessionmaker[Session]) -> None:
    with silent_receiver() as slow, run_receiver() as fast:
        base = f"127.0.0.1:{slow.port}"
        with sessions.begin() as s:
            urls = [f"{'https' if i % 2 else 'http'}://{base}/s{i}" for i in range(SLOW_HOOKS)]
            hostile, hostile_hooks = _tenant(s, urls)
            quiet, (quiet_hook,) = _tenant(s, [f"{fast.base_url}/quiet"])
        for hook in hostile_hooks:
            _queue(sessions, hostile, hook, PER_HOOK)
        total = SLOW_HOOKS * PER_HOOK
        quiet_ids = []

        with running(sessions):
            _within(lambda: slow.accepted >= 40, 20)  # the slow ones hold their senders
            quiet_ids += _queue(sessions, quiet, quiet_hook)
            took = _within(_arrives(fast, quiet_ids[-1]), 10)
            assert took < BOUND_S, f"the quiet tenant's delivery waited {took:.2f} s"
            _within(lambda: _attempted(sessions, hostile) >= total // 3, 30)
        # Stopped mid-way: every delivery it had claimed was sent and recorded, none left
        # leased (a lease would hold it for 2 * GRPO_WEBHOOK_TIMEOUT_S + 30 s).
        with sessions() as s:
            D = WebhookDelivery
            leased = select(func.count()).where(
                D.tenant_id == hostile, D.attempts > 0, D.last_error.is_(None)
            )
            assert s.scalar(leased) == 0
        assert 0 < _attempted(sessions, hostile) < total

        quiet_ids += _queue(sessions, quiet, quiet_hook)  # queued while none runs
        with running(sessions):
            started = time.monotonic()
            _within(_arrives(fast, quiet_ids[-1]), 10)
            assert time.monotonic() - started < BOUND_S + 2  # a process's start, and a pass
            _within(lambda: _attempted(sessions, hostile) == total, 30)
            # Each connection was closed when its attempt was cut, not left to the garbage
            # collector (off while we wait, so it cannot close one for us): the pool and the
            # process's sockets stay free. What once failed here, near the end of full suite
            # runs, was one https attempt cut by the deadline mid-handshake, a socket httpcore
            # never closes (test_cut_connections); 15 s is slack for a loaded machine.
            closed_without_the_collector(slow, 15)
            # One connection an attempt at most. Not one each exactly: on a loaded machine an
            # https attempt's 0.1 s to connect can run out before it reaches the socket
            # (299 of 300 once, in a full suite run); it is still recorded, as checked below.
            assert total - 10 <= slow.accepted <= total

            quiet_ids += _queue(sessions, quiet, quiet_hook)  # after the 300: still sent
            took = _within(_arrives(fast, quiet_ids[-1]), 10)
            assert took < BOUND_S, f"after the slow ones, a delivery waited {took:.2f} s"
            _within(lambda: _delivered(sessions, quiet) == len(quiet_ids), 5)

        with sessions() as s:
            rows = s.scalars(select(WebhookDelivery).where(WebhookDelivery.tenant_id == hostile))
            outcomes = {(r.status, r.attempts, r.last_error) for r in rows}
        assert outcomes == {
            ("pending", 1, f"no answer within {DEADLINE_S:g} s"),  # http: cut at the deadline
            ("pending", 1, f"no connection within {CONNECT_S:g} s"),  # https: at connecting
        }


def _delivered(sessions: sessionmaker[Session], tenant: str) -> int:
    D = WebhookDelivery
    with sessions() as s:
        stmt = select(func.count()).where(D.tenant_id == tenant, D.status == "delivered")
        return s.scalar(stmt) or 0
