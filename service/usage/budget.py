"""Per-tenant device-hour budgets (docs/usage.md): the operator sets one per tenant
(`grpo-service tenants set-budget`); it counts every device-second the tenant's jobs recorded
and its pre-flights held, for all time. At or over it, a submission (a pre-flight too) answers
402 and a running job is asked to pause at its next step boundary (that request is the jobs'
side: `service.jobs.pausing.pause_if_over_budget`). No web framework here: the API and the
training process share it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.problems import ProblemError
from service.models import Evaluation, JobUsage, Tenant, TinkerRequest
from service.models.base import aware, utcnow
from service.settings import get_settings
from service.usage import preflights

BUDGET_PROBLEM = "https://grpo-service.dev/problems/budget-exhausted"


class _Unread:
    """The tenant's budget, not read yet (None means "no budget")."""


UNREAD = _Unread()


@dataclass(frozen=True)
class BudgetState:
    limit_hours: float
    used_hours: float

    @property
    def exhausted(self) -> bool:
        return self.used_hours >= self.limit_hours

    def describe(self) -> str:
        return f"used {self.used_hours:.3g} of {self.limit_hours:.3g} h"

    def as_dict(self) -> dict[str, float]:
        return {"device_hours_limit": self.limit_hours, "device_hours_used": self.used_hours}


def device_seconds_used(session: Session, tenant_id: str) -> float:
    """Every device-second of the tenant: its jobs' recorded steps, its pre-flights, its Tinker
    requests and its evaluations (those still running up to now)."""
    total = session.scalar(
        select(func.coalesce(func.sum(JobUsage.device_seconds), 0.0)).where(
            JobUsage.tenant_id == tenant_id
        )
    )
    held = preflights.device_time(session, tenant_id, get_settings())
    tinker = session.scalar(  # the Tinker API's requests (docs/tinker.md)
        select(func.coalesce(func.sum(TinkerRequest.device_seconds), 0.0)).where(
            TinkerRequest.tenant_id == tenant_id
        )
    )
    total = float(total or 0.0) + float(tinker or 0.0)
    evaluations = session.scalar(
        select(func.coalesce(func.sum(Evaluation.device_seconds), 0.0)).where(
            Evaluation.tenant_id == tenant_id
        )
    )
    running = _running_evaluations_seconds(session, tenant_id)
    return float(total or 0.0) + float(evaluations or 0.0) + running + sum(s for _, _, s in held)


def _running_evaluations_seconds(session: Session, tenant_id: str) -> float:
    """What the tenant's running evaluations have held so far: an evaluation's claim is
    metered whole when it ends (`service.evaluations.rows.finish`)."""
    now = utcnow()
    started = session.scalars(
        select(Evaluation.started_at).where(
            Evaluation.tenant_id == tenant_id,
            Evaluation.status.in_(("running", "cancelling")),
            Evaluation.started_at.is_not(None),
        )
    )
    return sum(max(0.0, (now - aware(s)).total_seconds()) for s in started if s is not None)


def budget_state(
    session: Session, tenant_id: str, limit: float | None | _Unread = UNREAD
) -> BudgetState | None:
    """The tenant's budget and what its jobs used of it; None when it has no budget. `limit`:
    the tenant's `budget_device_hours` when the caller has read it already."""
    if isinstance(limit, _Unread):
        limit = session.scalar(select(Tenant.budget_device_hours).where(Tenant.id == tenant_id))
    if limit is None:
        return None
    return BudgetState(float(limit), device_seconds_used(session, tenant_id) / 3600)


def refuse_over_budget(
    session: Session, tenant_id: str, limit: float | None | _Unread = UNREAD
) -> None:
    """402 for new work of a tenant at or over its budget (waiting does not help: no
    Retry-After; the operator raises or clears the budget)."""
    state = budget_state(session, tenant_id, limit)
    if state is None or not state.exhausted:
        return
    error = ProblemError(
        402,
        "Payment Required",
        f"device-hour budget exhausted ({state.describe()}): ask the operator to raise it",
    )
    error.problem.type = BUDGET_PROBLEM
    raise error
