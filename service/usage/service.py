"""The tenant's usage report (`GET /v1/usage`): the recorded step usage (`job_usage`), the
device time its pre-flights held (under their `pf_` ids by job, device kind `preflight`), its
evaluations' device time and completion tokens (under their `eval_` ids), the jobs' stored
objects and the Tinker checkpoints (under their run's id), over whole UTC days, by job or by
day. Budgets: `service.usage.budget`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.problems import FieldError, invalid
from service.models import (
    Checkpoint,
    Evaluation,
    Job,
    JobUsage,
    RolloutFile,
    Tenant,
    TinkerCheckpoint,
    TinkerRequest,
)
from service.settings import get_settings
from service.usage import preflights
from service.usage.budget import budget_state
from service.usage.schemas import BudgetOut, GroupBy, UsageFigures, UsageReport, UsageRow

PREFLIGHT_KIND = "preflight"  # its worker's device kind is not recorded
TINKER_KIND = "tinker"  # the Tinker API's requests, by run (docs/tinker.md)
EVALUATION_KIND = "evaluation"  # an evaluation whose run never reported its device kind
_COUNTERS = ("device_seconds", "completion_tokens", "trained_tokens", "verifier_cpu_seconds")


def _utc_day(value: datetime, field: str) -> tuple[date, bool]:
    """The UTC day of `value` (naive: UTC), and whether `value` is that day's midnight."""
    try:
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # an offset that moves it out of the calendar
        raise invalid([FieldError(path=f"query.{field}", message="out of range")]) from None
    return utc.date(), utc.time() == time()


def _as_utc(value: datetime | None) -> datetime:
    if value is None:  # the queries below select only rows that have the time
        raise ValueError("a metered row without its time")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def day_window(start: datetime | None, end: datetime | None) -> tuple[date, date]:
    """[first day, first day not counted): `start`'s UTC day through the day before `end`, or
    `end`'s own day when `end` is inside it. Default: the current month."""
    today = datetime.now(UTC).date()
    first = _utc_day(start, "from")[0] if start else today.replace(day=1)
    if end is None:
        month = today.replace(day=1)
        stop = (month + timedelta(days=32)).replace(day=1)
    else:
        stop, midnight = _utc_day(end, "to")
        if not midnight:
            stop = stop + timedelta(days=1) if stop < date.max else stop
    if stop <= first:
        raise invalid([FieldError(path="query.to", message="must be after `from`")])
    return first, stop


def usage_report(
    session: Session,
    tenant_id: str,
    start: datetime | None,
    end: datetime | None,
    group_by: GroupBy,
) -> UsageReport:
    first, stop = day_window(start, end)
    rows: dict[Any, dict[str, Any]] = defaultdict(_empty)
    key_col = JobUsage.job_id if group_by == "job" else JobUsage.day
    recorded = session.execute(
        select(
            key_col,
            JobUsage.device_kind,
            func.sum(JobUsage.steps),
            *(func.sum(getattr(JobUsage, c)) for c in _COUNTERS),
        )
        .where(JobUsage.tenant_id == tenant_id, JobUsage.day >= first, JobUsage.day < stop)
        .group_by(key_col, JobUsage.device_kind)
    )
    for key, kind, steps, *values in recorded:
        row = rows[_day(key) if group_by == "day" else key]
        row["steps"] += int(steps or 0)
        for name, value in zip(_COUNTERS, values, strict=True):  # PostgreSQL sums: Decimal
            row[name] += int(value or 0) if name.endswith("tokens") else float(value or 0.0)
        row["device_seconds_by_kind"][kind] += float(values[0] or 0.0)
    since = datetime.combine(first, time(), UTC)
    for preflight_id, started, seconds in preflights.device_time(
        session, tenant_id, get_settings(), since
    ):
        if started.date() >= stop:
            continue
        row = rows[preflight_id if group_by == "job" else started.date()]
        row["device_seconds"] += seconds
        row["device_seconds_by_kind"][PREFLIGHT_KIND] += seconds
    for evaluation_id, started, seconds, tokens, kind in _evaluations(session, tenant_id, since):
        if started.date() >= stop:
            continue
        row = rows[evaluation_id if group_by == "job" else started.date()]
        row["device_seconds"] += seconds
        row["completion_tokens"] += int(tokens)
        row["device_seconds_by_kind"][kind or EVALUATION_KIND] += seconds
    for run_id, finished, seconds in _tinker_time(session, tenant_id, since, stop):
        row = rows[run_id if group_by == "job" else _as_utc(finished).date()]
        row["device_seconds"] += seconds
        row["device_seconds_by_kind"][TINKER_KIND] += seconds
    for job_id, written_at, size in _stored_objects(session, tenant_id, first, stop):
        rows[job_id if group_by == "job" else _as_utc(written_at).date()]["storage_bytes"] += size
    ordered = sorted(rows.items(), key=lambda kv: kv[0], reverse=group_by == "job")
    data = [_row(group_by, key, figures) for key, figures in ordered]
    state = budget_state(session, tenant_id)
    return UsageReport(
        from_=first,
        to=stop,
        group_by=group_by,
        data=data,
        totals=_totals(data),
        budget=BudgetOut(**state.as_dict()) if state else None,
    )


def _empty() -> dict[str, Any]:
    figures: dict[str, Any] = dict.fromkeys(_COUNTERS, 0)
    return figures | {"steps": 0, "storage_bytes": 0, "device_seconds_by_kind": defaultdict(float)}


def _day(value: date | str) -> date:
    return value if isinstance(value, date) else date.fromisoformat(value)


def _evaluations(
    session: Session, tenant_id: str, since: datetime
) -> Iterable[tuple[str, datetime, float, int, str | None]]:
    """(evaluation, started at, device-seconds, completion tokens, device kind) of the tenant's
    evaluations that ran, started at `since` or later (under their `eval_` ids by job)."""
    found = session.execute(
        select(
            Evaluation.id,
            Evaluation.started_at,
            Evaluation.device_seconds,
            Evaluation.completion_tokens,
            Evaluation.device_kind,
        ).where(
            Evaluation.tenant_id == tenant_id,
            Evaluation.started_at.is_not(None),
            Evaluation.started_at >= since,
        )
    )
    for evaluation_id, started, seconds, tokens, kind in found:
        yield evaluation_id, _as_utc(started), float(seconds), int(tokens), kind


def _tinker_time(
    session: Session, tenant_id: str, since: datetime, stop: date
) -> Iterable[tuple[str, datetime, float]]:
    """(run, finished at, device-seconds) of the tenant's executed Tinker requests; a base
    model's sampling, outside any run, under the base model's name."""
    until = datetime.combine(stop, time(), UTC)
    found = session.execute(
        select(
            func.coalesce(TinkerRequest.run_id, TinkerRequest.base_model),
            TinkerRequest.finished_at,
            TinkerRequest.device_seconds,
        ).where(
            TinkerRequest.tenant_id == tenant_id,
            TinkerRequest.device_seconds > 0,
            TinkerRequest.finished_at >= since,
            TinkerRequest.finished_at < until,
        )
    )
    for run, finished, seconds in found:
        yield run, _as_utc(finished), seconds


def _stored_objects(
    session: Session, tenant_id: str, first: date, stop: date
) -> Iterable[tuple[str, datetime, int]]:
    """(job, written at, bytes) of every checkpoint and rollout file of the tenant's jobs kept
    now and written in the window: a job's storage, always as stored (pruned and deleted
    objects are gone from it); and (run, written at, bytes) of its Tinker checkpoints, under
    their run's id by job, until deleted (overwritten, deleted, or expired and passed)."""
    since, until = (datetime.combine(d, time(), UTC) for d in (first, stop))
    for model in (Checkpoint, RolloutFile):
        rows = session.execute(
            select(model.job_id, model.created_at, model.size_bytes)
            .join(Job, Job.id == model.job_id)
            .where(Job.tenant_id == tenant_id, model.created_at >= since, model.created_at < until)
        )
        yield from ((job, written, size) for job, written, size in rows)
    tinker = session.execute(
        select(
            TinkerCheckpoint.run_id, TinkerCheckpoint.created_at, TinkerCheckpoint.size_bytes
        ).where(
            TinkerCheckpoint.tenant_id == tenant_id,
            TinkerCheckpoint.created_at >= since,
            TinkerCheckpoint.created_at < until,
        )
    )
    yield from ((run, written, size) for run, written, size in tinker)


def _row(group_by: GroupBy, key: Any, figures: dict[str, Any]) -> UsageRow:
    where = {"job_id": key} if group_by == "job" else {"day": key}
    by_kind = dict(sorted(figures.pop("device_seconds_by_kind").items()))
    return UsageRow(**where, **figures, device_seconds_by_kind=by_kind)


def _totals(rows: list[UsageRow]) -> UsageFigures:
    by_kind: dict[str, float] = defaultdict(float)
    for row in rows:
        for kind, seconds in row.device_seconds_by_kind.items():
            by_kind[kind] += seconds
    return UsageFigures(
        device_seconds=sum(r.device_seconds for r in rows),
        device_seconds_by_kind=dict(sorted(by_kind.items())),
        completion_tokens=sum(r.completion_tokens for r in rows),
        trained_tokens=sum(r.trained_tokens for r in rows),
        verifier_cpu_seconds=sum(r.verifier_cpu_seconds for r in rows),
        storage_bytes=sum(r.storage_bytes for r in rows),
    )


def set_budget(session: Session, tenant_name: str, device_hours: float | None) -> str | None:
    """The operator's `tenants set-budget` (None clears it): the tenant's id, or None when
    there is no such tenant."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == tenant_name))
    if tenant is None:
        return None
    tenant.budget_device_hours = device_hours
    session.flush()
    return tenant.id
