"""A run that reports what its process holds (`test_run_supervisor.py`): its life is
`main_process([ID, EPOCH, PARENT_PID])`, as a run module's is (`run_process.py`). With
GRPO_PROBE_SLEEP set it then sleeps, to be outlived or not."""

from __future__ import annotations

import json
import os
import sys
import time

from service.training import child

# Modules of the supervisor's process that a fork of it would still hold.
SUPERVISOR_MODULES = ("service.training.supervisor", "service.training.kinds", "_pytest", "pytest")
PRELOADED = ("torch", "transformers", "service.training.runner")


def main_process(argv: list[str]) -> int:
    entered = child.enter(argv)
    report = {
        "argv": argv,
        "entered": entered is not None,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "loaded": sorted(m for m in SUPERVISOR_MODULES if m in sys.modules),
        "preloaded": sorted(m for m in PRELOADED if m in sys.modules),
        "progress_fd": os.environ.get("GRPO_PROGRESS_FD"),
        "env": os.environ.get("GRPO_PROBE_ENV"),
    }
    with open(os.environ["GRPO_PROBE_REPORT"], "w") as fh:
        json.dump(report, fh)
    if os.environ.get("GRPO_PROBE_SLEEP"):
        time.sleep(120)
    return child.DONE
