"""`grpo-service api --workers N`: N processes on one port, each on a socket of its own; a
process that dies is started again, and connections are moved until the shares are even."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.connection_shares import CHECK_EVERY_S, ConnectionShares
from tests.e2e.services import free_port
from tests.service.test_supervisor import _descendants

CLI = [sys.executable, "-m", "service.cli"]


# The even-share test, on real count files
def _count_file(directory: Path, pid: int, held: int) -> None:
    (directory / str(pid)).write_bytes(held.to_bytes(8, "little", signed=True))


def test_a_process_alone_never_closes_a_connection(tmp_path: Path) -> None:
    shares = ConnectionShares(tmp_path / "shares")
    for _ in range(50):
        shares.opened()
    assert not shares.should_close_one()
    shares.close()
    assert not (tmp_path / "shares").exists()


def test_a_process_over_its_share_closes_one_at_a_time(tmp_path: Path) -> None:
    directory = tmp_path / "shares"
    shares = ConnectionShares(directory)
    sibling = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        _count_file(directory, sibling.pid, 2)
        _count_file(directory, gone.pid, 100)  # a process that died: not counted
        for _ in range(6):
            shares.opened()
        assert shares.should_close_one()  # 6 of 8 between two: over the even 4
        assert shares.held == 5  # counted out at once: its answer may take a while
        assert not shares.should_close_one()  # one at a time: not again at once
        assert not (directory / str(gone.pid)).exists()
        for held in (4, 3):  # 5 of 7 over 4, 4 of 6 over 3
            time.sleep(CHECK_EVERY_S * 2)
            assert shares.should_close_one() and shares.held == held
        time.sleep(CHECK_EVERY_S * 2)
        assert not shares.should_close_one()  # 3 of 5: its even share, rounded up
        assert (directory / str(shares.pid)).read_bytes() == (3).to_bytes(8, "little")
    finally:
        sibling.kill()
        sibling.wait()
        shares.close()
    assert [p.name for p in directory.iterdir()] == [str(sibling.pid)]  # not the last out


# The server
def _api_processes(supervisor: int) -> list[int]:
    found = []
    for pid in _descendants(supervisor):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"service.api_process" in argv and b"service.process_group" not in argv:
                found.append(pid)
    return sorted(found)


def _held(pids: list[int], port: int) -> list[int]:
    """Established connections to `port` each process holds (from /proc, not the counts)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
            inodes.add(f"socket:[{fields[9]}]")
    held = []
    for pid in pids:
        links = []
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                links.append(os.readlink(fd))
        held.append(sum(link in inodes for link in links))
    return held


class Client:
    """One keep-alive HTTP/1.1 connection that reconnects when told `Connection: close`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reconnects = 0
        self.sock = socket.create_connection(("127.0.0.1", port))

    def get(self) -> None:
        self.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        while len(body) < int(fields[b"content-length"]):
            body += self.sock.recv(65536)
        if fields.get(b"connection") == b"close":
            self.sock.close()
            self.reconnects += 1
            self.sock = socket.create_connection(("127.0.0.1", self.port))


def _wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
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
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env["GRPO_DATA_DIR"] = str(tmp_path / "data")
    subprocess.run([*CLI, "migrate"], env=env, check=True, capture_output=True)
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    api = subprocess.Popen(
        [*CLI, "api", "--workers", "2", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    started = time.monotonic()
    try:
        _wait_for(lambda: _healthy(port) and len(_api_processes(api.pid)) == 2, 90, "not up")
        # a process is started again only when it ran a while (not one that fails at start)
        time.sleep(max(0.0, started + 6 - time.monotonic()))
        yield api, port
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(timeout=60)
        log.close()


def test_a_dead_process_is_replaced_and_connections_move_to_it(server) -> None:  # type: ignore[no-untyped-def]
    api, port = server
    victim, survivor = _api_processes(api.pid)
    os.kill(victim, signal.SIGKILL)
    _wait_for(lambda: not Path(f"/proc/{victim}").exists(), 10, "not dead")
    # While it is away the kernel gives every new connection to the survivor.
    clients = [Client(port) for _ in range(20)]
    for client in clients:
        client.get()
    assert _held([survivor], port) == [20]

    _wait_for(lambda: len(_api_processes(api.pid)) == 2, 60, "not started again")
    replacement = next(p for p in _api_processes(api.pid) if p != survivor)
    _wait_for(lambda: _healthy(port), 30, "not serving")
    time.sleep(2)  # the replacement has bound its socket and imported the app by now

    def shares() -> list[int]:
        for client in clients:
            client.get()
        return _held([survivor, replacement], port)

    _wait_for(lambda: shares() == [10, 10], 30, f"shares stayed {shares()}")
    moved = sum(c.reconnects for c in clients)
    assert moved >= 10
    for _ in range(5):  # even now: no more moves
        time.sleep(CHECK_EVERY_S * 2)
        assert shares() == [10, 10]
    assert sum(c.reconnects for c in clients) == moved
    for client in clients:
        client.sock.close()


def test_a_port_in_use_is_refused_before_any_process_starts(tmp_path: Path) -> None:
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
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr
