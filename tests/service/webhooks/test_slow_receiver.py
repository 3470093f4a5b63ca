"""A slow webhook receiver holds only its own deliveries: a receiver that trickles a header line
every second (each read within httpx's per-read timeout) is cut at the total deadline, and
another webhook's delivery, due while it trickles, arrives at once (SQLite and PostgreSQL)."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
from cryptography.fernet import Fernet
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.models import Tenant, Webhook, WebhookDelivery
from service.secrets import crypto
from service.settings import Settings
from service.webhooks import dispatcher
from service.webhooks.service import secret_name
from tests.e2e.webhook_receiver import run_receiver

DEADLINE_S = 3.0
SETTINGS = Settings(
    webhook_allow_private=True,
    webhook_timeout_s=DEADLINE_S,
    webhook_poll_s=0.2,
    secrets_key=SecretStr(Fernet.generate_key().decode()),
)


@contextmanager
def trickling_receiver(stop: threading.Event) -> Iterator[tuple[str, threading.Event]]:
    """Answers every connection with a status line, then one header line a second, forever
    (until `stop`); `called` is set once a request came in."""
    server = socket.create_server(("127.0.0.1", 0))
    called = threading.Event()

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            called.set()
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(1.0):
                try:
                    conn.sendall(b"X-Slow: yes\r\n")
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/slow", called
    finally:
        stop.set()
        server.close()


def _webhook(session: Session, url: str) -> str:
    tenant = f"ten_{secrets.token_hex(4)}"
    session.add(Tenant(id=tenant, name=tenant))
    session.flush()
    webhook_id = f"wh_{secrets.token_hex(6)}"
    sealed = crypto.encrypt(SETTINGS, tenant, secret_name(webhook_id), "whsec_test")
    session.add(Webhook(id=webhook_id, tenant_id=tenant, url=url, events=["*"],
                        secret_ciphertext=sealed))  # fmt: skip
    return webhook_id


def _queue(sessions: sessionmaker[Session], webhook_id: str) -> str:
    with sessions.begin() as s:
        hook = s.get(Webhook, webhook_id)
        assert hook is not None
        delivery = WebhookDelivery(
            id=f"msg_{secrets.token_hex(8)}",
            webhook_id=webhook_id,
            tenant_id=hook.tenant_id,
            event_type="ping",
            body="{}",
        )
        s.add(delivery)
        return delivery.id


def _wait_for(predicate, timeout: float) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "not within the time allowed"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_trickling_receiver_delays_only_itself(sessions: sessionmaker[Session]) -> None:
    stop = threading.Event()
    with trickling_receiver(stop) as (slow_url, slow_called), run_receiver() as fast:
        with sessions.begin() as s:
            slow_hook = _webhook(s, slow_url)
            fast_hook = _webhook(s, f"{fast.base_url}/fast")
        slow_delivery = _queue(sessions, slow_hook)
        sender = dispatcher.Dispatcher(SETTINGS, sessions)
        thread = threading.Thread(target=anyio.run, args=(sender.serve, stop), daemon=True)
        thread.start()
        try:
            _wait_for(slow_called.is_set, 10)
            sent = time.monotonic()
            _queue(sessions, fast_hook)  # due while the slow one trickles
            took = _wait_for(lambda: fast.got("/fast"), DEADLINE_S)
            assert took < 2.0, f"the other webhook's delivery waited {took:.1f} s"

            def cut() -> bool:
                with sessions() as s:
                    row = s.get(WebhookDelivery, slow_delivery)
                    return row is not None and row.last_error is not None

            _wait_for(cut, DEADLINE_S + 3)  # trickling on, but cut at its deadline
            assert time.monotonic() - sent < DEADLINE_S + 2
            with sessions() as s:
                row = s.get(WebhookDelivery, slow_delivery)
                assert row is not None and row.status == "pending" and row.attempts == 1
                assert row.last_error == f"no answer within {DEADLINE_S:g} s"
        finally:
            stop.set()
            thread.join(DEADLINE_S + 5)
    assert not thread.is_alive()
