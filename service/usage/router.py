"""`GET /v1/usage`: the tenant's usage report (docs/usage.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from service.http.deps import SessionDep, TenantDep
from service.http.openapi import problems
from service.usage import service
from service.usage.schemas import GroupBy, UsageReport

router = APIRouter(responses=problems(400, 401, 422, 500))

WINDOW = (
    "RFC 3339 date or date-time (UTC when it names no offset). Usage is kept per UTC day: "
    "the report covers whole days"
)


@router.get("/v1/usage", response_model=UsageReport, tags=["usage"])
def get_usage(
    session: SessionDep,
    tenant: TenantDep,
    from_: Annotated[
        datetime | None,
        Query(
            alias="from",
            description=f"{WINDOW}, from this one's day (default: the month's first day).",
        ),  # fmt: skip
    ] = None,
    to: Annotated[
        datetime | None,
        Query(
            description=f"{WINDOW}, up to this instant (a date: its day is not counted; "
            "default: the month's end)."
        ),  # fmt: skip
    ] = None,
    group_by: Annotated[GroupBy, Query(description="One row per job or per UTC day.")] = "day",
) -> UsageReport:
    """What this tenant's jobs used: device-seconds by device kind, tokens, verifier
    CPU-seconds, storage; one row per job or per day, and the totals."""
    return service.usage_report(session, tenant, from_, to, group_by)
