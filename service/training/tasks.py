"""The jobs domain's Celery tasks: thin adapters that pass an id to the run supervisor with
its kind (`kinds.JOB`, `kinds.EVALUATION`, `kinds.PREFLIGHT`); the supervisor runs the queued
row whose turn it is on that row's queue (`kinds.supervise_turn`, `turns.py`).

Only the worker imports this module (`service.worker` names it in `include`; the API enqueues
by task name), once, in its main process: the supervisor is imported here, not in each task,
so that every pool child (one a task) is forked with it loaded. None of it loads the engine:
each run is a fresh interpreter the supervisor starts (`python -m <the kind's child>`).
"""

import signal

from celery.signals import after_setup_logger, after_setup_task_logger, worker_process_init

from service.core.db import end_idle_transactions_after
from service.settings import get_settings
from service.training import kinds
from service.training.kinds import supervise_turn
from service.worker import EVALUATION_TASK, PREFLIGHT_TASK, TRAIN_TASK, app
from workers.observability import JsonFormatter


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger, *_args, **_kwargs) -> None:
    """Worker logs as JSON lines (job id and epoch on every line of a run)."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())


@worker_process_init.connect
def _no_frozen_row_locks(**_kwargs: object) -> None:
    """A supervisor stuck inside a transaction longer than its lease loses the transaction."""
    end_idle_transactions_after(get_settings().lease_seconds)


@worker_process_init.connect
def _idle_ignores_sigterm(**_kwargs: object) -> None:
    """An idle pool process ignores SIGTERM (the worker's process group stopping): its parent's
    warm shutdown ends it cleanly, where billiard's own handler would exit with status 15,
    logged as an ERROR on every normal stop. (Ignored, billiard leaves it so.) While it
    supervises a run, the supervisor's handler passes SIGTERM on to the run (`supervisor.py`);
    between a claim and that handler, the row is left to its lease and the reconciler."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@app.task(name=TRAIN_TASK)
def train_job(job_id: str) -> None:
    # This process holds the lease; the training runs in a fresh interpreter of its own.
    supervise_turn(kinds.JOB, job_id)


@app.task(name=PREFLIGHT_TASK)
def preflight(preflight_id: str) -> None:
    supervise_turn(kinds.PREFLIGHT, preflight_id)


@app.task(name=EVALUATION_TASK)
def evaluation(evaluation_id: str) -> None:
    supervise_turn(kinds.EVALUATION, evaluation_id)
