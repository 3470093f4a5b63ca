"""The API server bounds slow and oversized clients (`grpo-service api`, through the
supervisor's real command line): connections that send nothing, trickle header lines or stall
a body are closed after GRPO_HTTP_HEADER_TIMEOUT_S / GRPO_HTTP_BODY_TIMEOUT_S (408 when no
response had started), oversized headers are a 431, idle keep-alive connections close after
GRPO_HTTP_KEEPALIVE_S, and past GRPO_HTTP_LIMIT_CONCURRENCY uvicorn answers 503, while a
well-behaved client is served throughout and a slow but steady upload is never cut off.
Before, uvicorn held every half-open connection for ever (3,050 after 100 s)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.services import RunningService, _spawn, _wait_ready, free_port, stop_all

HEADER_S, BODY_S, KEEPALIVE_S, CONCURRENCY = 1, 1, 1, 400
FLOOD = 100  # connections of each kind


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    work = tmp_path_factory.mktemp("http-timeouts")
    port = free_port()
    env = {
        **os.environ,
        "GRPO_DATA_DIR": str(work / "data"),
        "GRPO_HTTP_HEADER_TIMEOUT_S": str(HEADER_S),
        "GRPO_HTTP_BODY_TIMEOUT_S": str(BODY_S),
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


def test_half_open_connections_are_closed(svc: RunningService) -> None:
    request_line = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    # FastAPI reads a pydantic body before it authenticates: the handler waits for the rest.
    stalled_body = b"POST /v1/verifiers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    stalled_body += b"Content-Length: 1000\r\n\r\n" + b'{"name": "'
    silent = [_connect(svc) for _ in range(FLOOD)]
    trickling = [_connect(svc, request_line) for _ in range(FLOOD)]
    stalling = [_connect(svc, stalled_body) for _ in range(FLOOD)]
    started = time.monotonic()
    served = []
    while time.monotonic() - started < HEADER_S + 2.5:
        for sock in trickling:  # a header line every 0.3 s: each resets no deadline
            with contextlib.suppress(OSError):  # already closed by the server
                sock.sendall(b"X-Slow: 1\r\n")
        r = httpx.get(f"{svc.base_url}/healthz", timeout=5)
        served.append(r.status_code)
        time.sleep(0.3)
    assert served and set(served) == {200}  # a well-behaved client is served throughout
    held = {"silent": 0, "trickling": 0, "stalling": 0}
    answers: set[bytes] = set()
    for kind, socks in (("silent", silent), ("trickling", trickling), ("stalling", stalling)):
        for sock in socks:
            closed, data = _closed_by_server(sock, 0.05)
            held[kind] += not closed
            if data:
                answers.add(data.split(b"\r\n", 1)[0])
            sock.close()
    print(f"connections still held {HEADER_S + 2.5:.1f} s later: {held}")
    assert held == {"silent": 0, "trickling": 0, "stalling": 0}
    assert answers <= {b"HTTP/1.1 408 Request Timeout"} and answers  # the idle ones are told


def test_oversized_headers_are_refused(svc: RunningService) -> None:
    sock = _connect(svc, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
    closed, data = _closed_by_server(sock, 5)
    assert closed and data.startswith(b"HTTP/1.1 431 "), data[:200]
    sock.close()


def test_a_slow_but_steady_upload_is_not_cut_off(svc: RunningService) -> None:
    body = b'{"name": "slow", "kind": "exact_match", "config": {}' + b" " * 1000 + b"}"
    head = b"POST /v1/verifiers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock = _connect(svc, head + b"Content-Length: %d\r\n\r\n" % len(body))
    for i in range(0, len(body), 100):  # ~3 s in all, no pause as long as the body timeout
        closed, data = _closed_by_server(sock, 0)
        assert not closed and not data  # still reading the body: no answer, no close
        sock.sendall(body[i : i + 100])
        time.sleep(BODY_S * 0.25)
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
        time.sleep(HEADER_S + 1)  # the idle ones are closed at their header deadline
        assert httpx.get(f"{svc.base_url}/healthz", timeout=5).status_code == 200
    finally:
        for sock in idle:
            sock.close()
