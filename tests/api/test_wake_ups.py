"""A submission answers once its row is committed, without waiting for the broker: the wake-up
is published by a thread of the API process. Real Redis behind a TCP relay the test can stall
(a broker that accepts and never answers, the worst case: before, each submission waited out
the socket timeout and its retries, 10 s and more); once the relay flows again, the wake-ups
queued behind the stalled one still reach Redis."""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.api.conftest import tenant_client
from tests.api.helpers import job_body, make_dataset, make_verifier
from tests.api.server import LIMITS, serve_in_process
from tests.e2e.services import RunningService
from tests.e2e.test_faults import wait_for
from tests.redis_db import API, PrivateRedis

QUEUE = "wake-ups-test"


class StallableRelay:
    """Relays TCP connections to Redis; `stalled` set, it holds every byte in both directions
    (connections stay open, nothing moves)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.stalled = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        with selectors.DefaultSelector() as sel:
            for s in peers:
                sel.register(s, selectors.EVENT_READ)
            while not self._closing.is_set():
                if self.stalled.is_set():
                    time.sleep(0.05)
                    continue
                ready = sel.select(timeout=0.1)
                if self.stalled.is_set():  # set while waiting: what arrived stays unread
                    continue
                for key, _ in ready:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        a.close(), b.close()
                        return
                    peers[key.fileobj].sendall(data)  # type: ignore[index]
        a.close(), b.close()

    def close(self) -> None:
        self._closing.set()
        self.listener.close()


@pytest.fixture
def api_behind_a_relay(
    tmp_path: Path, tiny_model_dir: Path, redis_server: PrivateRedis
) -> Iterator[tuple[RunningService, StallableRelay, redis.Redis]]:
    """The API with its broker behind a relay, and a client of the broker itself."""
    broker = redis_server.client(API)
    broker.delete(QUEUE)
    relay = StallableRelay(("127.0.0.1", redis_server.port))
    queues = {**json.loads(LIMITS["GRPO_QUEUES"]), QUEUE: {}}
    env = {
        "GRPO_BROKER_URL": f"redis://127.0.0.1:{relay.port}/{API}",
        "GRPO_QUEUES": json.dumps(queues),
    }
    try:
        with serve_in_process(env, tmp_path, tiny_model_dir) as svc:
            yield svc, relay, broker
    finally:
        relay.close()
        broker.delete(QUEUE)


def _queued_jobs(broker: redis.Redis) -> bytes:
    """The raw messages waiting in the queue (each names its job in its headers)."""
    return b"".join(broker.lrange(QUEUE, 0, -1))


def test_a_stalled_broker_does_not_hold_up_submissions(
    api_behind_a_relay: tuple[RunningService, StallableRelay, redis.Redis],
) -> None:
    svc, relay, broker = api_behind_a_relay
    client = tenant_client(svc)
    make_verifier(client)
    body = job_body(make_dataset(client), queue=QUEUE)

    first = client.post("/v1/jobs", json=body).json()
    wait_for(lambda: first["id"].encode() in _queued_jobs(broker), "the first wake-up")

    relay.stalled.set()
    stalled = []
    for _ in range(2):
        started = time.monotonic()
        r = client.post("/v1/jobs", json=body)
        elapsed = time.monotonic() - started
        assert r.status_code == 201, r.text
        assert r.json()["status"] == "queued"
        assert elapsed < 2.0, f"a submission waited {elapsed:.1f} s for a stalled broker"
        stalled.append(r.json()["id"])
    time.sleep(1)
    assert not any(job.encode() in _queued_jobs(broker) for job in stalled)  # nothing got through

    relay.stalled.clear()  # the held publish times out and is retried on a new connection
    held = "the held wake-ups"
    wait_for(lambda: all(job.encode() in _queued_jobs(broker) for job in stalled), held)
