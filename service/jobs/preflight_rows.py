"""A pre-flight row's states: queued -> running (a worker claimed it) -> succeeded | failed.

Every transition is one conditional UPDATE on the status it leaves, so the API's expiry and
the worker's outcome cannot both win: a worker that finishes after its pre-flight expired
writes nothing, and a row is claimed once. No lease is renewed: a pre-flight is short, and
GRPO_PREFLIGHT_TIMEOUT_S bounds each state (the worker kills its run at that point; a row whose
worker died is failed by whoever reads it next, `expire_overdue`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from service.core.db import rows_matched
from service.models import Preflight
from service.models.base import utcnow
from service.settings import Settings


def _cutoff(settings: Settings) -> Any:
    return utcnow() - timedelta(seconds=settings.preflight_timeout_s)


def claim(session: Session, preflight_id: str, settings: Settings) -> Preflight | None:
    """queued -> running for this worker; None when it was taken, or waited too long."""
    now = utcnow()
    claimed = rows_matched(
        session.execute(
            update(Preflight)
            .where(
                Preflight.id == preflight_id,
                Preflight.status == "queued",
                Preflight.created_at > _cutoff(settings),
            )
            .values(status="running", started_at=now)
            .execution_options(synchronize_session=False)
        )
    )
    if not claimed:
        return None
    row = session.get(Preflight, preflight_id, populate_existing=True)
    if row is not None:
        session.expunge(row)
    return row


def finish(
    session: Session,
    preflight_id: str,
    result: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> bool:
    """running -> succeeded (`result`) or failed (`error`); False when it was no longer running."""
    status = "failed" if error is not None else "succeeded"
    return bool(
        rows_matched(
            session.execute(
                update(Preflight)
                .where(Preflight.id == preflight_id, Preflight.status == "running")
                .values(status=status, result=result, error=error, finished_at=utcnow())
                .execution_options(synchronize_session=False)
            )
        )
    )


def expire_overdue(session: Session, row: Preflight, settings: Settings) -> None:
    """Fail the row (and refresh it) if it has been queued or running past the timeout."""
    limit = settings.preflight_timeout_s
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


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def device_time(
    session: Session, tenant_id: str, settings: Settings, since: datetime | None = None
) -> Iterator[tuple[str, datetime, float]]:
    """(pre-flight, started at, device-seconds) of the tenant's pre-flights that ran, started
    at `since` or later: a worker's device is held from the claim to the outcome, and at most
    GRPO_PREFLIGHT_TIMEOUT_S (the worker kills the run there; a row whose worker died is
    failed later, by whoever reads it). One still running counts up to now."""
    stmt = select(Preflight.id, Preflight.started_at, Preflight.finished_at).where(
        Preflight.tenant_id == tenant_id, Preflight.started_at.is_not(None)
    )
    if since is not None:
        stmt = stmt.where(Preflight.started_at >= since)
    now = utcnow()
    for preflight_id, started, finished in session.execute(stmt):
        start = _aware(started)
        held = (_aware(finished) if finished else now) - start
        yield preflight_id, start, min(max(held.total_seconds(), 0.0), settings.preflight_timeout_s)
