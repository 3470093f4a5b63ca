"""A pre-flight row's states, each transition one conditional UPDATE (as an evaluation's in
`service.evaluations.rows`; claim, renew and fence are `service.core.leases`'):

    create   -> queued                                       (the API)
    claim    queued | running with an expired lease -> running, epoch + 1, lease_until
             (never a row queued past GRPO_PREFLIGHT_TIMEOUT_S: that one fails)
    renew    lease_until = now+ttl WHERE epoch = mine        (the worker's run supervisor)
    finish   running -> succeeded | failed WHERE epoch = mine
    expire   running with an expired lease -> queued (or failed after max_attempts)
                                                             (the reconciler: its worker died)

So the API's expiry, the reconciler and the worker's outcome cannot both win: a worker that
finishes after its pre-flight expired or was taken over writes nothing, and a row is run by one
claim at a time. GRPO_PREFLIGHT_TIMEOUT_S still bounds each state: the worker kills a run past
it, and a row left past it is failed by whoever reads it next (`expire_overdue`). The device
time the rows held is accounting: `service.usage.preflights`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from service.core import leases
from service.core.db import rows_matched
from service.models import Preflight
from service.models.base import utcnow
from service.settings import Settings

ACTIVE = ("running",)


def _cutoff(settings: Settings) -> Any:
    return utcnow() - timedelta(seconds=settings.preflight_timeout_s)


def claim(session: Session, preflight_id: str, settings: Settings) -> int | None:
    """Take the pre-flight under a lease: the new epoch; None when another worker has it, it
    is final, or it waited past its timeout (then it fails: its client gave up on it)."""
    row = session.get(Preflight, preflight_id)
    if row is not None:
        if row.status == "queued":
            expire_overdue(session, row, settings)
        session.expunge(row)  # the claim's UPDATE need not evaluate it in Python
    return leases.claim(
        session, Preflight, preflight_id, settings.lease_seconds, keep_first_start=True
    )


def renew(session: Session, preflight_id: str, epoch: int, lease_seconds: float) -> str:
    """Extend this run's lease; the row's status, or LeaseLost."""
    return leases.renew(session, Preflight, preflight_id, epoch, lease_seconds, ACTIVE)


def finish(
    session: Session,
    preflight_id: str,
    epoch: int,
    result: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> str | None:
    """running -> succeeded (`result`) or failed (`error`) while this epoch's run holds the row;
    the new status, or None when it no longer did."""
    status = "failed" if error is not None else "succeeded"
    done = rows_matched(
        session.execute(
            update(Preflight)
            .where(leases.held(Preflight, preflight_id, epoch, ACTIVE))
            .values(status=status, result=result, error=error, finished_at=utcnow())
            .execution_options(synchronize_session=False)
        )
    )
    return status if done else None


def expire(session: Session, max_attempts: int) -> list[Preflight]:
    """The reconciler's pass over lost leases (the worker died): each row goes back to the
    queue, or fails once it has had `max_attempts` claims. Returns the rows to enqueue again."""
    now = utcnow()
    lost = and_(Preflight.status == "running", Preflight.lease_until < now)
    message = (
        f"its worker died or stopped renewing the lease, {max_attempts} times "
        "(the last claim's lease lapsed)"
    )
    session.execute(
        update(Preflight)
        .where(lost, Preflight.attempts >= max_attempts)
        .values(status="failed", error={"code": "lease_lost", "message": message}, finished_at=now)
        .execution_options(synchronize_session=False)
    )
    return list(
        session.scalars(
            update(Preflight)
            .where(lost)
            .values(status="queued", enqueued_at=now)
            .returning(Preflight)
            .execution_options(synchronize_session=False)
        )
    )


def waiting_since(session: Session, before: Any) -> list[Preflight]:
    """Queued rows enqueued before `before`: their message may be lost."""
    return leases.waiting_since(session, Preflight, before)


def requeue(session: Session, row: Preflight) -> None:
    leases.requeue(session, Preflight, row.id)


def expire_overdue(session: Session, row: Preflight, settings: Settings) -> None:
    """Fail the row (and refresh it) if it has been queued or running past the timeout."""
    limit = settings.preflight_timeout_s
    since: InstrumentedAttribute[datetime | None]  # the column the timeout runs from
    if row.status == "queued":
        since, message = (
            Preflight.created_at,
            (
                f"no worker of queue {row.queue!r} started it within {limit:g}s "
                "(GRPO_PREFLIGHT_TIMEOUT_S)"
            ),
        )
    elif row.status == "running":
        since, message = (
            Preflight.started_at,
            (
                f"it did not finish within {limit:g}s of its start (GRPO_PREFLIGHT_TIMEOUT_S): "
                "its worker stopped it, or died"
            ),
        )
    else:
        return
    session.execute(
        update(Preflight)
        .where(Preflight.id == row.id, Preflight.status == row.status, since < _cutoff(settings))
        .values(
            status="failed",
            error={"code": "preflight_timeout", "message": message},
            finished_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    )
    session.refresh(row)


def count_open(session: Session, tenant_id: str, settings: Settings) -> int:
    """The tenant's pre-flights queued or running and not yet past their timeout."""
    cutoff = _cutoff(settings)
    return (
        session.scalar(
            select(func.count())
            .select_from(Preflight)
            .where(
                Preflight.tenant_id == tenant_id,
                or_(
                    and_(Preflight.status == "queued", Preflight.created_at > cutoff),
                    and_(Preflight.status == "running", Preflight.started_at > cutoff),
                ),
            )
        )
        or 0
    )
