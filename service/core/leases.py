"""Leases on rows that one worker at a time runs (jobs, evaluations): claim, renew, fence.

A leased row has `status`, `epoch`, `attempts` and `lease_until` columns. A claim takes a
queued row, or a running one whose lease has lapsed, and bumps its epoch; every write of the run
that claimed it is fenced on that epoch, so a run that lost its lease (a zombie past it, a
process another worker's claim replaced) writes nothing.

    claim    queued (or running with lease_until < now) -> running, epoch += 1
    renew    lease_until = now + lease, only while the row is still this epoch's and active
    fence    the first statement of a run's every write: WHERE epoch = mine, else LeaseLost
    fail_lapsed  running with lease_until < now -> failed (rows that are never run twice)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol, TypeVar

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Mapped, Session

from service.core.db import rows_matched
from service.models.base import utcnow


class Leased(Protocol):
    """A table whose rows a run holds under a lease (a job, an evaluation, a Tinker request):
    its mapped columns, as the declarative class holds them."""

    id: ClassVar[Mapped[str]]
    status: ClassVar[Mapped[str]]
    epoch: ClassVar[Mapped[int]]
    lease_until: ClassVar[Mapped[datetime | None]]


class Claimable(Leased, Protocol):
    """A leased table whose rows are claimed again after a lapse (not a Tinker request's)."""

    attempts: ClassVar[Mapped[int]]
    started_at: ClassVar[Mapped[datetime | None]]


class Queued(Protocol):
    """A table whose queued rows are sent to the queue again when their message may be lost."""

    id: ClassVar[Mapped[str]]
    status: ClassVar[Mapped[str]]
    # Mapped[datetime] on evaluations, Mapped[datetime | None] on jobs and pre-flights: a
    # protocol's class attribute matches one type exactly (Mapped is invariant)
    enqueued_at: ClassVar[Mapped[Any]]


Q = TypeVar("Q", bound=Queued)


class LeaseLost(RuntimeError):
    """The run no longer holds the row: another claim replaced it, or it ended."""


def claim(
    session: Session,
    model: type[Claimable],
    row_id: str,
    lease_seconds: float,
    keep_first_start: bool,
) -> int | None:
    """Take the row: the new epoch, or None when another worker has it or it is done.
    `keep_first_start`: `started_at` stays the first claim's (else this claim's time)."""
    now = utcnow()
    expired = and_(model.status == "running", model.lease_until < now)
    return session.scalar(
        update(model)
        .where(model.id == row_id, or_(model.status == "queued", expired))
        .values(
            status="running",
            epoch=model.epoch + 1,
            attempts=model.attempts + 1,
            lease_until=now + timedelta(seconds=lease_seconds),
            started_at=func.coalesce(model.started_at, now) if keep_first_start else now,
        )
        .returning(model.epoch)
    )


def held(
    model: type[Leased], row_id: str, epoch: int, active: Sequence[str]
) -> ColumnElement[bool]:
    """The condition that this epoch's run still holds the row (its status one of `active`)."""
    return and_(model.id == row_id, model.epoch == epoch, model.status.in_(active))


def renew(
    session: Session, model: type[Leased], row_id: str, epoch: int, lease_seconds: float,
    active: Sequence[str],
) -> str:  # fmt: skip
    """Extend this run's lease; the row's status (one of `active`), or LeaseLost."""
    status: str | None = session.scalar(
        update(model)
        .where(held(model, row_id, epoch, active))
        .values(lease_until=utcnow() + timedelta(seconds=lease_seconds))
        .returning(model.status)
    )
    if status is None:
        raise LeaseLost(f"{row_id} epoch {epoch} no longer holds the lease")
    return status


def fence(
    session: Session, model: type[Leased], row_id: str, epoch: int, active: Sequence[str]
) -> str:
    """A no-op UPDATE on the row while this run holds it (so the check holds the row's lock to
    the commit; it does not extend the lease); the row's status, or LeaseLost."""
    status: str | None = session.scalar(
        update(model)
        .where(held(model, row_id, epoch, active))
        .values(epoch=model.epoch)
        .returning(model.status)
    )
    if status is None:
        raise LeaseLost(f"{row_id} epoch {epoch} no longer holds the lease")
    return status


def fail_lapsed(session: Session, model: type[Leased], error: dict[str, Any]) -> int:
    """Fail the running rows whose lease lapsed, with `error`; how many. For rows that are not
    claimed again (a Tinker request: not idempotent). A row running with no lease (claimed
    before it had one) counts as lapsed."""
    now = utcnow()
    return rows_matched(
        session.execute(
            update(model)
            .where(
                model.status == "running", or_(model.lease_until < now, model.lease_until.is_(None))
            )
            .values(status="failed", error=error, finished_at=now)
            .execution_options(synchronize_session=False)
        )
    )


def waiting_since(session: Session, model: type[Q], before: datetime) -> list[Q]:
    """Queued rows enqueued before `before`: their message may be lost."""
    return list(
        session.scalars(select(model).where(model.status == "queued", model.enqueued_at < before))
    )


def requeue(session: Session, model: type[Queued], row_id: str) -> None:
    """Mark a queued row as enqueued again now (its message is being sent again)."""
    session.execute(
        update(model)
        .where(model.id == row_id, model.status == "queued")
        .values(enqueued_at=utcnow())
        .execution_options(synchronize_session=False)
    )
