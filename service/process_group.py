"""A process group that dies with the supervisor: `python -m service.process_group GRACE -- CMD`.

The supervisor starts each child (uvicorn, a Celery worker) through this small leader, in a
process group of its own. The leader asks the kernel for SIGTERM when its parent dies
(`PR_SET_PDEATHSIG`), even by SIGKILL, runs CMD in its group and waits. On SIGTERM (the
supervisor stopping it, or the supervisor gone) it passes SIGTERM to the whole group, so the
command's own children (a Celery pool process training a job, uvicorn's workers) get it too and
a training run checkpoints and hands its job back; whatever still runs after GRACE seconds is
killed. Without it, a killed supervisor left its children running, re-parented to init.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn, Protocol

PR_SET_PDEATHSIG = 1


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, top down (children of each of its threads, recursively)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                todo += children
    return found


class Child(Protocol):
    """A child process, as `subprocess.Popen` is one."""

    pid: int

    def wait(self, timeout: float | None = None) -> int: ...


def kill_tree(proc: Child) -> None:
    """SIGKILL a child started in a process group of its own, its group and every descendant
    (verifier sandboxes live in sessions of their own, outside the group), and reap it."""
    doomed = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def exit_status(code: object) -> int:
    """The status an interpreter exits with for `SystemExit(code)`: an int as it is, None 0,
    anything else 1."""
    return code if isinstance(code, int) else 0 if code is None else 1


def exit_now(code: int) -> NoReturn:
    """End this process once its outcome is committed and what it opened is closed: logs and
    standard streams flushed, without the interpreter's teardown (in a process that loaded
    torch, seconds of unloading thousands of modules, which keep a worker from its next task)."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(grace_seconds: float, command: list[str]) -> int:
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the supervisor died before the kernel could be told
        return 1
    stop = threading.Event()

    def on_term(*_: object) -> None:
        if not stop.is_set():
            stop.set()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(os.getpgrp(), signal.SIGTERM)  # the command and its children, not us

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which asks us
    child = subprocess.Popen(command)
    while child.poll() is None and not stop.wait(0.2):
        pass
    if not stop.is_set():  # the command ended by itself: its children go with it
        on_term()
        return child.returncode
    deadline = time.monotonic() + grace_seconds
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if child.poll() is None:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # also ends this leader: nothing outlives it
    return child.wait()


def main() -> None:
    grace, separator, *command = sys.argv[1:]
    if separator != "--" or not command:
        raise SystemExit("usage: python -m service.process_group GRACE -- CMD [ARGS...]")
    raise SystemExit(run(float(grace), command))


if __name__ == "__main__":
    main()
