"""What the forkserver alone runs as it starts (first in `run_process.PRELOAD`; a run, forked
from it, undoes both first thing, in `run_process._run`):

- it ignores SIGTERM: a worker stopping signals its whole process group, the forkserver
  included, and the runs it forked die with it (PR_SET_PDEATHSIG); the supervisor, not the
  forkserver's death, tells a run to hand its row back;
- it leaves at once when the supervisor is gone (its end of the forkserver's `alive` pipe
  closed), without the interpreter's teardown of torch's modules (seconds), during which its
  runs would train on, unsupervised.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from multiprocessing import forkserver


def leave_at_once() -> None:
    os._exit(0)


def _in_the_forkserver() -> bool:
    """Imported by multiprocessing's forkserver `main` (its preload), not by anything else."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


if _in_the_forkserver():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    atexit.register(leave_at_once)
