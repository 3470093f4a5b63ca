"""The jobs domain's Celery tasks: thin adapters that pass an id to the watchdog (a training
job), to the pre-flight supervisor (`preflight_run.supervise`) or to the evaluation's
(`evaluation_run.supervise`).

Only the worker imports this module (`service.worker` names it in `include`; the API enqueues
by task name), once, in its main process: the supervisors are imported here, not in each task,
so that every pool child (one a task) is forked with them loaded instead of importing them
again (~2 s of CPU a task). The main process also imports the engine, once, at start
(`forked.preload`): a pool child forks the training process with it loaded. None of them
runs anything of the engine: the training runs in that child process. Once the worker has
stopped, its main process ends without unloading them.
"""

import atexit

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_init,
    worker_process_init,
    worker_shutdown,
)
from celery.worker import WorkController

from service.core.db import end_idle_transactions_after
from service.process_group import exit_now, exit_status
from service.settings import get_settings
from service.training import evaluation_run, forked, preflight_run
from service.training.watchdog import supervise_job
from service.worker import EVALUATION_TASK, PREFLIGHT_TASK, TRAIN_TASK, app
from workers.observability import JsonFormatter


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger, *_args, **_kwargs) -> None:  # type: ignore[no-untyped-def]
    """Worker logs as JSON lines (job id and epoch on every line of a run)."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())


@worker_init.connect
def _preload_engine(**_kwargs: object) -> None:
    """Before the pool starts: every pool child, and the training process it forks, has it."""
    forked.preload()


@worker_shutdown.connect
def _exit_without_teardown(sender: WorkController, **_kwargs: object) -> None:
    """The worker has stopped (its pool joined, its messages acknowledged): end the process
    as the interpreter would, its exit functions run, short of unloading every module the
    preload imported (torch: ~1.3 s of each worker's stop)."""
    atexit._run_exitfuncs()
    exit_now(exit_status(sender.exitcode))  # the status Celery would exit with


@worker_process_init.connect
def _no_frozen_row_locks(**_kwargs: object) -> None:
    """A trainer stuck inside a transaction longer than its lease loses the transaction."""
    end_idle_transactions_after(get_settings().lease_seconds)


@app.task(name=TRAIN_TASK)
def train_job(job_id: str) -> None:
    # This process holds the lease and the watchdog; the training runs in a child of its own.
    supervise_job(job_id)


@app.task(name=PREFLIGHT_TASK)
def preflight(preflight_id: str) -> None:
    # As train_job: the pre-flight itself runs in a child process (service.training.preflight_run).
    preflight_run.supervise(preflight_id)


@app.task(name=EVALUATION_TASK)
def evaluation(evaluation_id: str) -> None:
    # As train_job: this process holds the lease; the evaluation runs in a child of its own.
    evaluation_run.supervise(evaluation_id)
