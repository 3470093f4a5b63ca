"""The API server's limits on clients, uvicorn's own (`grpo-service api`, its real command
line): request headers that grow past GRPO_HTTP_MAX_HEADER_BYTES are refused (400), idle
keep-alive connections close after GRPO_HTTP_KEEPALIVE_S while a request body that pauses
longer is still read, and past GRPO_HTTP_LIMIT_CONCURRENCY uvicorn answers 503. Deadlines for
slow headers and bodies are a buffering proxy's job (docs/architecture.md#deployment-in-detail)."""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.services import RunningService, _spawn, _wait_ready, free_port, stop_all

KEEPALIVE_S, CONCURRENCY = 1, 400


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    work = tmp_path_factory.mktemp("http-timeouts")
    port = free_port()
    env = {
        **os.environ,
        "GRPO_DATA_DIR": str(work / "data"),
        "GRPO_HTTP_KEEPALIVE_S": str(KEEPALIVE_S),
        "GRPO_HTTP_MAX_HEADER_BYTES": "4096",
        "GRPO_HTTP_LIMIT_CONCURRENCY": str(CONCURRENCY),
    }
    running = RunningService(base_url=f"http://127.0.0.1:{port}", env=env, log_dir=work)
    running.cli("migrate")
    running.procs.append(_spawn(["api", "--port", str(port)], env, work / "api.log"))
    try:
        _wait_ready(running)
        yield running
    finally:
        stop_all(running.procs)


def _connect(svc: RunningService, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", int(svc.base_url.rsplit(":", 1)[1])))
    if first:
        sock.sendall(first)
    return sock


def _closed_by_server(sock: socket.socket, wait_s: float = 0.2) -> tuple[bool, bytes]:
    """Whether the server has closed the connection, and what it sent before."""
    data = b""
    while True:
        readable, _, _ = select.select([sock], [], [], wait_s)
        if not readable:
            return False, data
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return True, data
        if not chunk:
            return True, data
        data += chunk


def test_oversized_headers_are_refused(svc: RunningService) -> None:
    """h11 bounds what it buffers of an unfinished request head (headers still arriving)."""
    sock = _connect(svc, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000)
    closed, data = _closed_by_server(sock, 5)
    assert closed and data.startswith(b"HTTP/1.1 400 "), data[:200]
    sock.close()


def test_a_body_pausing_longer_than_the_keepalive_is_read(svc: RunningService) -> None:
    body = b'{"name": "slow", "kind": "exact_match", "config": {}' + b" " * 100 + b"}"
    head = b"POST /v1/verifiers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock = _connect(svc, head + b"Content-Length: %d\r\n\r\n" % len(body))
    for i in range(0, len(body), 60):
        closed, data = _closed_by_server(sock, KEEPALIVE_S * 1.5)  # a pause past keep-alive
        assert not closed and not data  # still reading the body: no answer, no close
        sock.sendall(body[i : i + 60])
    closed, data = _closed_by_server(sock, 5)
    assert data.startswith(b"HTTP/1.1 401 "), data[:200]  # read in full, then refused: no key
    sock.close()


def test_idle_keepalive_connections_close(svc: RunningService) -> None:
    sock = _connect(svc, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    readable, _, _ = select.select([sock], [], [], 5)
    assert readable and sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    answered = time.monotonic()
    closed, _ = _closed_by_server(sock, KEEPALIVE_S + 2)
    assert closed and time.monotonic() - answered < KEEPALIVE_S + 1.5
    sock.close()


def test_past_the_concurrency_limit_requests_get_503(svc: RunningService) -> None:
    idle = [_connect(svc) for _ in range(CONCURRENCY)]
    try:
        time.sleep(0.2)
        assert httpx.get(f"{svc.base_url}/healthz", timeout=5).status_code == 503
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.5)  # the server has seen them close
    assert httpx.get(f"{svc.base_url}/healthz", timeout=5).status_code == 200
