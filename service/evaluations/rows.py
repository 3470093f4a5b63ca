"""An evaluation row's states, each transition one conditional UPDATE (as a job's in
`service.jobs.lifecycle`, whose `LeaseLost` it shares):

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
A claim whose worker died (its lease expired) counts nothing: when it stopped is unknown.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from service.jobs.lifecycle import LeaseLost
from service.models import Evaluation, EvaluationSample
from service.models.base import utcnow

ACTIVE = ("running", "cancelling")


def claim(session: Session, evaluation_id: str, lease_seconds: float) -> int | None:
    """Take the evaluation: the new epoch, or None when another worker has it or it is done."""
    now = utcnow()
    expired = and_(Evaluation.status == "running", Evaluation.lease_until < now)
    return session.scalar(
        update(Evaluation)
        .where(Evaluation.id == evaluation_id, or_(Evaluation.status == "queued", expired))
        .values(
            status="running",
            epoch=Evaluation.epoch + 1,
            attempts=Evaluation.attempts + 1,
            lease_until=now + timedelta(seconds=lease_seconds),
            started_at=now,
        )
        .returning(Evaluation.epoch)
    )


def _held(evaluation_id: str, epoch: int) -> Any:
    return and_(
        Evaluation.id == evaluation_id,
        Evaluation.epoch == epoch,
        Evaluation.status.in_(ACTIVE),
    )


def renew(session: Session, evaluation_id: str, epoch: int, lease_seconds: float) -> str:
    """Extend this run's lease; its status (`cancelling` asks it to stop), or LeaseLost."""
    status = session.scalar(
        update(Evaluation)
        .where(_held(evaluation_id, epoch))
        .values(lease_until=utcnow() + timedelta(seconds=lease_seconds))
        .returning(Evaluation.status)
    )
    if status is None:
        raise LeaseLost(f"evaluation {evaluation_id} epoch {epoch} no longer holds the lease")
    return status


def fence(session: Session, evaluation_id: str, epoch: int) -> str:
    """The first statement of every write of a run (a no-op UPDATE: it holds the row's lock to
    the commit); its status, or LeaseLost."""
    status = session.scalar(
        update(Evaluation)
        .where(_held(evaluation_id, epoch))
        .values(epoch=Evaluation.epoch)
        .returning(Evaluation.status)
    )
    if status is None:
        raise LeaseLost(f"evaluation {evaluation_id} epoch {epoch} no longer holds the lease")
    return status


def stored(session: Session, evaluation_id: str, epoch: int) -> int:
    """Samples this claim has stored: the run's progress, as its pool process sees it."""
    return (
        session.scalar(
            select(func.count())
            .select_from(EvaluationSample)
            .where(EvaluationSample.evaluation_id == evaluation_id, EvaluationSample.epoch == epoch)
        )
        or 0
    )


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
        .where(_held(evaluation_id, epoch))
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
    held = (now - _aware(started)).total_seconds() if started is not None else 0.0
    session.execute(
        update(Evaluation)
        .where(_held(evaluation_id, epoch))
        .values(
            status=status,
            results=results,
            error=error,
            finished_at=now,
            device_seconds=Evaluation.device_seconds + max(0.0, held),
        )
    )
    return status


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


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
    done = session.execute(
        update(Evaluation)
        .where(Evaluation.id == row.id, Evaluation.status == row.status)
        .values(status=status, finished_at=finished)
        .execution_options(synchronize_session=False)
    ).rowcount
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
    return list(
        session.scalars(
            select(Evaluation).where(Evaluation.status == "queued", Evaluation.enqueued_at < before)
        )
    )


def requeue(session: Session, row: Evaluation) -> None:
    session.execute(
        update(Evaluation)
        .where(Evaluation.id == row.id, Evaluation.status == "queued")
        .values(enqueued_at=utcnow())
        .execution_options(synchronize_session=False)
    )
