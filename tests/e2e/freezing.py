"""Freeze a worker's run of a job the way a paused VM or a stalled host would: the claiming
pool process (the watchdog) and every process below it (the training process, its verifier
sandboxes) stop at once, and later go on from where they were."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

from service.process_group import descendants


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    return [pid, *descendants(pid)]


def freeze(pid: int) -> list[int]:
    """SIGSTOP `pid` and its descendants, top down (a parent stopped first cannot start a
    child that escapes); returns what was stopped, for `thaw`."""
    stopped: list[int] = []
    for _ in range(3):  # a child started between the listing and the stop is caught next round
        for proc in process_tree(pid):
            if proc not in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc, signal.SIGSTOP)
                    stopped.append(proc)
    return stopped


def thaw(pids: list[int]) -> None:
    for proc in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc, signal.SIGCONT)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[list[int]]:
    stopped = freeze(pid)
    try:
        yield stopped
    finally:
        thaw(stopped)
