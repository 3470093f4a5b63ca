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


def _celery_pool_child(root: int) -> bool:
    """Whether a Celery worker under `root` has forked its pool child: a fork keeps its
    parent's command line (the supervisors' process-group leaders only name celery)."""

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    tree = _children()
    return any(
        b"celery" in cmdline(parent) and cmdline(child) == cmdline(parent)
        for parent in _descendants(root)
        for child in tree.get(parent, [])
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_supervisor_leaves_no_process_behind(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env["GRPO_DATA_DIR"] = str(tmp_path / "data")
    log, family = (tmp_path / "up.log").open("wb"), set()
    up = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "up", "--port", str(port), "--grace-seconds", "3"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        deadline = time.monotonic() + 60  # until the family is whole
        while not _celery_pool_child(up.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
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
        log.close()
