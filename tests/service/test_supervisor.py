"""No child outlives the supervisor: `grpo-service up` killed with SIGKILL takes its uvicorn and
Celery processes (and their children) with it, instead of leaving them re-parented to init."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.services import free_port


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _celery_pool_child(root: int, initialised: bool = False) -> bool:
    """Whether a Celery worker under `root` has forked its pool child: a fork keeps its
    parent's command line (the supervisors' process-group leaders only name celery); with
    `initialised`, one that also ignores SIGTERM (the pool process's initialiser ran)."""

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    def ignores_sigterm(pid: int) -> bool:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        ignored = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
        return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGTERM - 1)))

    tree = _children()
    return any(
        b"celery" in cmdline(parent)
        and cmdline(child) == cmdline(parent)
        and (not initialised or ignores_sigterm(child))
        for parent in _descendants(root)
        for child in tree.get(parent, [])
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_up(tmp_path: Path, initialised: bool = False) -> tuple[subprocess.Popen[bytes], Path]:
    """`grpo-service up` on a data folder of its own, once it answers and its Celery worker has
    forked its pool child; its output goes to the returned log file."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env["GRPO_DATA_DIR"] = str(tmp_path / "data")
    path = tmp_path / "up.log"
    with path.open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "up", "--port", str(port),
             "--grace-seconds", "3"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    deadline = time.monotonic() + 60  # until the family is whole
    while not _celery_pool_child(up.pid, initialised) and time.monotonic() < deadline:
        time.sleep(0.2)
    return up, path


def test_a_killed_supervisor_leaves_no_process_behind(tmp_path: Path) -> None:
    up, family = _start_up(tmp_path)[0], set()
    try:
        family = _descendants(up.pid)
        assert len(family) >= 3, family  # uvicorn, celery, its pool child (and their leaders)
        up.send_signal(signal.SIGKILL)
        up.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in family):
            time.sleep(0.2)
        survivors = [p for p in family if _alive(p)]
        assert not survivors, [Path(f"/proc/{p}/cmdline").read_bytes() for p in survivors]
    finally:
        for pid in family | {up.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_normal_stop_is_quiet(tmp_path: Path) -> None:
    """Ctrl-C on an idle `grpo-service up`: status 0 and no ERROR line or traceback in its
    output (the idle Celery pool process used to die of the group's SIGTERM, logged as an
    ERROR by its parent)."""
    up, log = _start_up(tmp_path, initialised=True)
    family = _descendants(up.pid)
    try:
        assert _celery_pool_child(up.pid, initialised=True)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    finally:
        for pid in family | {up.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    loud = [line for line in text.splitlines() if "ERROR" in line or "Traceback" in line]
    assert not loud, loud
