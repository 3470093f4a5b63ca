"""How every run's process begins (a job's attempt, an evaluation, a pre-flight), started by
the run supervisor (`supervisor.py`) as `python -m <module> ID EPOCH SUPERVISOR_PID`.

Imports nothing heavy: a run handed back while torch loads must be able to leave at once.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any, NoReturn

from service.process_group import die_with_parent

DONE = 0  # the run recorded its outcome (or lost its lease: nothing is left to it)
LEFT_TO_RECONCILER = 75  # the run handed its row back (SIGTERM), or the database stayed away


def enter(argv: list[str], on_sigterm: Callable[..., Any] | None = None) -> tuple[str, int] | None:
    """The row and epoch this run was started for, with SIGTERM bound to `on_sigterm` (by
    default: hand the row back at once) and the run bound to die with its supervisor; None
    when the supervisor died before the kernel could be told (the run must not start)."""
    row_id, epoch, supervisor = argv[0], int(argv[1]), int(argv[2])
    signal.signal(signal.SIGTERM, on_sigterm or hand_back)
    die_with_parent(signal.SIGKILL)  # the supervisor holds the lease: never outlive it
    if os.getppid() != supervisor:
        return None
    return row_id, epoch


def hand_back(*_: object) -> NoReturn:
    """SIGTERM: leave the row to its lease and the reconciler (it starts over elsewhere)."""
    raise SystemExit(LEFT_TO_RECONCILER)
