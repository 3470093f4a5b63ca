"""`grpo-service api --workers N`: uvicorn's own worker processes on one port. Both of two
serve requests, a worker that dies is started again, SIGTERM stops them all (no orphan), and
a port in use is refused before any worker starts."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.services import free_port
from tests.service.test_supervisor import _alive, _descendants

CLI = [sys.executable, "-m", "service.cli"]


def _workers(server: int) -> list[int]:
    """uvicorn's worker processes under `server` (multiprocessing's spawned children)."""
    found = []
    for pid in _descendants(server):
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return sorted(found)


def _holder(pids: list[int], sock: socket.socket) -> int | None:
    """Which of `pids` holds the server end of the client connection `sock` (from /proc)."""
    client_port = sock.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rsplit(":", 1)[1], 16) == client_port and fields[3] == "01":
            inode = f"socket:[{fields[9]}]"  # the server's end: its remote port is ours
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == inode:
                    return pid
    return None


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env["GRPO_DATA_DIR"] = str(tmp_path / "data")
    subprocess.run([*CLI, "migrate"], env=env, check=True, capture_output=True)
    port = free_port()
    with (tmp_path / "api.log").open("wb") as log:
        api = subprocess.Popen(
            [*CLI, "api", "--workers", "2", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for(lambda: _healthy(port) and len(_workers(api.pid)) == 2, 90, "not up")
        yield api, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            api.send_signal(signal.SIGTERM)
        api.wait(timeout=60)


def test_two_workers_serve_and_stop_together(
    server: tuple[subprocess.Popen[bytes], int],
) -> None:
    api, port = server
    workers = _workers(api.pid)
    served_by: set[int] = set()
    deadline = time.monotonic() + 60
    while served_by != set(workers):  # which worker accepts a connection is the kernel's race
        assert time.monotonic() < deadline, f"only {served_by} of {workers} served"
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            # Found from /proc while the connection is open; a sample whose server end is not
            # listed (yet) there names no worker and counts for neither (seen once in a run).
            if (holder := _holder(workers, sock)) is not None:
                served_by.add(holder)

    victim, survivor = workers
    os.kill(victim, signal.SIGKILL)
    _wait_for(lambda: len(set(_workers(api.pid)) - {victim}) == 2, 60, "not started again")
    _wait_for(lambda: _healthy(port), 30, "not serving")
    family = _descendants(api.pid)
    assert survivor in family

    api.send_signal(signal.SIGTERM)
    assert api.wait(timeout=60) == 0
    _wait_for(lambda: not any(_alive(p) for p in family), 20, "a worker outlived the server")


def test_a_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "GRPO_DATA_DIR": str(tmp_path / "data")}
        out = subprocess.run(
            [*CLI, "api", "--workers", "2", "--port", str(port)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode != 0
    assert "address already in use" in out.stderr.lower()
    assert "Started parent process" not in out.stderr  # refused before any worker started
