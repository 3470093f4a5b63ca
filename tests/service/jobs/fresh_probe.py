"""A run that reports what its interpreter holds (`test_run_supervisor.py`):
`python -m tests.service.jobs.fresh_probe ID EPOCH SUPERVISOR_PID`."""

from __future__ import annotations

import json
import os
import sys

# Modules of the supervisor's process that a fork of it would still hold.
SUPERVISOR_MODULES = ("service.training.supervisor", "sqlalchemy", "_pytest", "celery", "pytest")

if __name__ == "__main__":
    report = {
        "argv": sys.argv[1:],
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "loaded": sorted(m for m in SUPERVISOR_MODULES if m in sys.modules),
        "progress_fd": os.environ.get("GRPO_PROGRESS_FD"),
    }
    with open(os.environ["GRPO_PROBE_REPORT"], "w") as fh:
        json.dump(report, fh)
