"""The device time a tenant's pre-flights held (they record no usage rows of their own: a
pre-flight's worker holds its device from the claim to the outcome), for its usage report and
its budget."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Preflight
from service.models.base import aware, utcnow
from service.settings import Settings


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
        assert started is not None  # the query's filter
        start = aware(started)
        held = (aware(finished) if finished else now) - start
        yield preflight_id, start, min(max(held.total_seconds(), 0.0), settings.preflight_timeout_s)
