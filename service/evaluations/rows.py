"""An evaluation row's states, each transition one conditional UPDATE (as a job's in
`service.jobs.lifecycle`; claim, renew and fence are `service.core.leases`'):

    create   -> queued                                   (the API)
    claim    queued | running with an expired lease -> running, epoch + 1, lease_until
    renew    lease_until = now+ttl WHERE epoch = mine    (the worker's pool process, while the
                                                          run's process lives; returns the status)
    fence    every write of a run checks WHERE epoch = mine first; zero rows -> LeaseLost
    finish   running | cancelling -> succeeded | failed | cancelled WHERE epoch = mine
    cancel   queued -> cancelled; running -> cancelling  (the API)
    expire   running with an expired lease -> queued (or failed after max_attempts);
             cancelling with an expired lease -> cancelled  (the reconciler)

Device time is metered per claim, in the transition that ends it (`finish`, whoever calls it:
the run, or the pool process once it killed the run): the seconds from the claim to the outcome.
A claim whose worker died (its lease expired) counts nothing: when it stopped is unknown. A
claim still running counts up to now in the tenant's budget (`service.usage.budget`), so that
the budget holds while an evaluation runs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from service.core import leases
from service.core.db import rows_matched
from service.models import Evaluation, EvaluationSample
from service.models.base import aware, utcnow

ACTIVE = ("running", "cancelling")
OPEN = ("queued", *ACTIVE)  # what counts against GRPO_EVAL_MAX_OPEN_PER_TENANT


def claim(session: Session, evaluation_id: str, lease_seconds: float) -> int | None:
    """Take the evaluation: the new epoch, or None when another worker has it or it is done."""
    return leases.claim(session, Evaluation, evaluation_id, lease_seconds, keep_first_start=False)


def renew(session: Session, evaluation_id: str, epoch: int, lease_seconds: float) -> str:
    """Extend this run's lease; its status (`cancelling` asks it to stop), or LeaseLost."""
    return leases.renew(session, Evaluation, evaluation_id, epoch, lease_seconds, ACTIVE)


def fence(session: Session, evaluation_id: str, epoch: int) -> str:
    """The first statement of every write of a run; its status, or LeaseLost."""
    return leases.fence(session, Evaluation, evaluation_id, epoch, ACTIVE)


def start_over(session: Session, evaluation_id: str, epoch: int) -> None:
    """A new claim drops what an earlier one stored: samples are written by one run only."""
    fence(session, evaluation_id, epoch)
    session.execute(
        delete(EvaluationSample).where(
            EvaluationSample.evaluation_id == evaluation_id, EvaluationSample.epoch < epoch
        )
    )


def finish(
    session: Session,
    evaluation_id: str,
    epoch: int,
    results: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> str | None:
    """The run's outcome: a cancel asked for wins (`cancelled`), else succeeded (`results`) or
    failed (`error`). The final status, or None when the run no longer held the row."""
    found = session.execute(
        select(Evaluation.status, Evaluation.started_at)
        .where(leases.held(Evaluation, evaluation_id, epoch, ACTIVE))
        .with_for_update()
    ).first()
    if found is None:
        return None
    current, started = found
    if current == "cancelling":
        status, results, error = "cancelled", None, None
    else:
        status = "failed" if error is not None else "succeeded"
    now = utcnow()
    held = (now - aware(started)).total_seconds() if started is not None else 0.0
    session.execute(
        update(Evaluation)
        .where(leases.held(Evaluation, evaluation_id, epoch, ACTIVE))
        .values(
            status=status,
            results=results,
            error=error,
            finished_at=now,
            device_seconds=Evaluation.device_seconds + max(0.0, held),
        )
    )
    return status


def add_usage(
    session: Session, evaluation_id: str, tokens: int = 0, device_kind: str | None = None
) -> None:
    """Meter the tokens a run sampled (unfenced: a run that lost its lease still spent them)."""
    values: dict[str, Any] = {"completion_tokens": Evaluation.completion_tokens + tokens}
    if device_kind is not None:
        values["device_kind"] = device_kind
    session.execute(update(Evaluation).where(Evaluation.id == evaluation_id).values(**values))


def cancel(session: Session, row: Evaluation) -> bool:
    """The API's cancel: queued -> cancelled, running -> cancelling; False when it is final."""
    if row.status == "cancelling":
        return True
    moves = {"queued": ("cancelled", utcnow()), "running": ("cancelling", None)}
    if row.status not in moves:
        return False
    status, finished = moves[row.status]
    done = rows_matched(
        session.execute(
            update(Evaluation)
            .where(Evaluation.id == row.id, Evaluation.status == row.status)
            .values(status=status, finished_at=finished)
            .execution_options(synchronize_session=False)
        )
    )
    session.refresh(row)
    return bool(done) or row.status in ("cancelling", "cancelled")


def expire(session: Session, max_attempts: int) -> list[Evaluation]:
    """The reconciler's pass over lost leases; returns the rows to enqueue again."""
    now = utcnow()
    lost = Evaluation.lease_until < now
    session.execute(
        update(Evaluation)
        .where(Evaluation.status == "cancelling", lost)
        .values(status="cancelled", finished_at=now)
        .execution_options(synchronize_session=False)
    )
    message = f"its worker stopped renewing the lease {max_attempts} times"
    session.execute(
        update(Evaluation)
        .where(Evaluation.status == "running", lost, Evaluation.attempts >= max_attempts)
        .values(status="failed", error={"code": "lease_lost", "message": message}, finished_at=now)
        .execution_options(synchronize_session=False)
    )
    back = list(
        session.scalars(
            update(Evaluation)
            .where(Evaluation.status == "running", lost)
            .values(status="queued", enqueued_at=now)
            .returning(Evaluation)
            .execution_options(synchronize_session=False)
        )
    )
    return back


def waiting_since(session: Session, before: Any) -> list[Evaluation]:
    """Queued rows enqueued before `before`: their message may be lost."""
    return leases.waiting_since(session, Evaluation, before)


def requeue(session: Session, row: Evaluation) -> None:
    leases.requeue(session, Evaluation, row.id)
