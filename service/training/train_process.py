"""The training process: `run([JOB_ID, EPOCH, SUPERVISOR_PID])`.

`python -m service.training.train_process JOB_ID EPOCH SUPERVISOR_PID`: a fresh interpreter
started by the run supervisor (`supervisor.py`, kind `kinds.JOB`) that claimed the job, in a
process group of its own, with the progress pipe's descriptor in GRPO_PROGRESS_FD. Everything
tenant-driven that runs on the worker (the engine on the tenant's data, the verifier sandboxes
and built-in helper it starts) runs here or below, never in the process that renews the lease.
It dies with its supervisor (PR_SET_PDEATHSIG), and its exit status tells the supervisor what is
left to do (`child.DONE`, `child.LEFT_TO_RECONCILER`; anything else is a crash). A job
of `resources.devices` N > 1 is trained by N ranks this process launches as its children, in
its group (`ranks.py`).
"""

from __future__ import annotations

import logging
import sys
import threading

from service.process_group import exit_now
from service.training import child


def main(argv: list[str]) -> int:
    # SIGTERM (the supervisor passing on a worker's shutdown) may come while torch still loads:
    # it is kept and honoured at the first step boundary (checkpoint, hand the job back).
    release = threading.Event()
    if (entered := child.enter(argv, lambda *_: release.set())) is None:
        return 1
    job_id, epoch = entered

    from service.core.db import end_idle_transactions_after, session_scope
    from service.models import Job
    from service.settings import get_settings
    from service.training.progress import Beacon
    from workers.observability import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    settings = get_settings()
    end_idle_transactions_after(settings.lease_seconds)
    beacon = Beacon.from_env()
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None or job.epoch != epoch:
            return 0  # taken over before we started: nothing of it is ours
        session.expunge(job)
    from service.training.runner import run_claimed

    if job.trainer_ranks > 1:
        from service.training.ranks import run_group

        return run_group(job, epoch, settings, beacon, release)
    return run_claimed(job, epoch, settings, beacon, release)


def _exit_if_ended(job_id: str, code: int) -> None:
    """Leave at once when the run has ended the job: its outcome is committed and what it
    opened is closed (trackers finished, sandboxes stopped, files uploaded), so the
    interpreter's own teardown of torch's thousands of modules (~2 s) would only keep the worker
    from its next job. A job handed back or paused exits normally: its trackers' runs stay open
    and their libraries finish them at exit."""
    from sqlalchemy import select

    from service.core.db import session_scope
    from service.models import FINAL_STATUSES, Job

    try:
        with session_scope() as session:
            if session.scalar(select(Job.status).where(Job.id == job_id)) not in FINAL_STATUSES:
                return
    except Exception:  # noqa: BLE001 (the database away: the ordinary exit, no harm)
        return
    exit_now(code)


def run(argv: list[str]) -> int:
    """The training process's life: its exit status (`supervisor.DONE`, ...)."""
    code = main(argv)
    _exit_if_ended(argv[0], code)
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
