"""The three kinds of run the supervisor (`supervisor.py`) sees through, each described by its
table's transitions, its child module and its budgets:

- a job's attempt (`train_process`): an attempt killed or crashed ends as `lifecycle.end_attempt`
  says (requeued, or failed after the last attempt; a cancelled one `cancelled`);
- an evaluation (`evaluation_run`): a killed or crashed run fails (`cancelled` if a cancel was
  asked for); a lapsed lease is requeued by the reconciler;
- a pre-flight (`preflight_run`): as an evaluation, and bounded in all by
  GRPO_PREFLIGHT_TIMEOUT_S (`preflight_timeout`), since its client waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import worker
from service.core.db import session_scope
from service.evaluations import rows as evaluation_rows
from service.jobs import lifecycle
from service.models import Evaluation, Preflight
from service.preflight import rows as preflight_rows
from service.settings import Settings
from service.training import turns
from service.training.runner import claim_job
from service.training.supervisor import Cause, Claim, RunKind, supervise


def _error(cause: Cause) -> dict[str, str]:
    """The row's `error`: the cause's code and message (the rest is the job event's detail)."""
    return {"code": cause["code"], "message": cause["message"]}


# -- jobs --------------------------------------------------------------------------------------
def _claim_job(job_id: str, settings: Settings) -> Claim | None:
    claimed = claim_job(job_id, settings)
    if claimed is None:
        return None
    job, epoch = claimed
    with session_scope() as session:
        turns.mark_served(session, job.tenant_id, job.queue)
    return Claim(epoch, job.queue, job.tenant_id, job.devices)


def _renew_job(session: Session, job_id: str, epoch: int, settings: Settings) -> str:
    return lifecycle.renew(session, job_id, epoch, settings.lease_seconds)


def _end_job(
    session: Session, job_id: str, epoch: int, cause: Cause, settings: Settings
) -> str | None:
    return lifecycle.end_attempt(session, job_id, epoch, settings.max_attempts, cause)


JOB = RunKind(
    name="job",
    process="the training process",
    child="service.training.train_process",
    claim=_claim_job,
    renew=_renew_job,
    end=_end_job,
    enqueue=lambda job_id, c: worker.enqueue_training(job_id, c.queue, c.devices),
)


# -- evaluations and pre-flights: the same transitions (`rows`), on their own tables ---------
def _row_kind(
    name: str,
    child: str,
    rows: ModuleType,
    model: Any,
    claim: Callable[[Session, str, Settings], int | None],
    enqueue: Callable[[str, Claim], None],
    **budget: Any,
) -> RunKind:
    def claim_row(row_id: str, settings: Settings) -> Claim | None:
        with session_scope() as session:
            epoch = claim(session, row_id, settings)
            if epoch is None:
                return None
            queue, tenant_id = session.execute(
                select(model.queue, model.tenant_id).where(model.id == row_id)
            ).one()
            turns.mark_served(session, tenant_id, queue)
        return Claim(epoch, queue, tenant_id)

    def renew(session: Session, row_id: str, epoch: int, settings: Settings) -> str:
        return str(rows.renew(session, row_id, epoch, settings.lease_seconds))

    def end(session: Session, row_id: str, epoch: int, cause: Cause, _: Settings) -> str | None:
        status: str | None = rows.finish(session, row_id, epoch, None, _error(cause))
        return status

    return RunKind(
        name=name,
        process=f"the {name} process",
        child=child,
        claim=claim_row,
        renew=renew,
        end=end,
        enqueue=enqueue,
        **budget,
    )


EVALUATION = _row_kind(
    "evaluation",
    "service.training.evaluation_run",
    evaluation_rows,
    Evaluation,
    lambda session, row_id, settings: evaluation_rows.claim(
        session, row_id, settings.lease_seconds
    ),
    lambda row_id, c: worker.enqueue_evaluation(row_id, c.queue),
)
PREFLIGHT = _row_kind(
    "pre-flight",
    "service.training.preflight_run",
    preflight_rows,
    Preflight,
    preflight_rows.claim,
    lambda row_id, c: worker.enqueue_preflight(row_id, c.queue),
    total_budget=lambda settings: settings.preflight_timeout_s,
    total_code="preflight_timeout",
    total_setting="GRPO_PREFLIGHT_TIMEOUT_S",
)


KINDS = {kind.name: kind for kind in (JOB, EVALUATION, PREFLIGHT)}


def supervise_turn(kind: RunKind, row_id: str, command: list[str] | None = None) -> None:
    """What a run's message does on a worker: claim and see through the queued row whose turn it
    is on that row's queue (`turns.order`), this row or another tenant's; one that another
    worker claims first passes the turn to the next (`command`: as `supervise`'s, tests)."""
    with session_scope() as session:
        found = turns.where(session, kind.name, row_id)
        candidates = turns.order(session, *found) if found is not None else []
    for name, candidate in candidates:
        if supervise(KINDS[name], candidate, command=command):
            return
