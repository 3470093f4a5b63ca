"""The open-jobs limit, exact: a submission inserts its job, then takes a per-tenant lock held
until its transaction commits and counts its tenant's live jobs (its own included) under it,
so two racing submissions can never both take the last place.

The lock is taken last, after the validation and the inserts, so that it is held for one
count and the commit: one tenant's submissions queue on it one at a time, and the shorter the
time each holds it, the more of them commit per second.

On PostgreSQL the lock is the tenant's row (`SELECT … FOR NO KEY UPDATE`: it serialises one
tenant's submissions but, unlike `FOR UPDATE`, does not block inserts whose foreign keys point
at the tenant, such as the job the submission has just inserted, or its dataset uploads).
Each statement of a READ COMMITTED transaction reads a fresh snapshot, so the count that
follows the lock sees every job committed by the submission that held it before. SQLite has
no row locks: a no-op `UPDATE` of the tenant row takes the database's write lock (which the
job's insert already holds), and every other writer waits for it (`busy_timeout`).

The lock also reads the tenant's device-hour budget (`service.usage.budget`), so that a
submission spends no statement of its own on it. On PostgreSQL the lock and the count go to the
server together in one round trip (psycopg's pipeline mode): the server runs the count the
moment it grants the lock, and the lock is held for one answer's trip back and the COMMIT
rather than for two of each.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Select, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.orm import Session

from service.core.problems import ProblemError, too_many
from service.models import LIVE_STATUSES, Job, Tenant
from service.settings import Settings

# Built once, with bound parameters: no statement to build or cache key to compute per request.
# Counted up to `up_to` only: whether a tenant is over the limit needs no more, and the count
# runs under the tenant's lock, so it must not grow with a tenant's thousands of live jobs
# (bench/README.md, "Figures behind design choices").
_OPEN_JOBS = select(func.count()).select_from(
    select(Job.tenant_id)  # in the index: an index-only scan
    .where(Job.tenant_id == bindparam("tenant"), Job.status.in_(LIVE_STATUSES))
    .limit(bindparam("up_to"))
    .subquery()
)
_LOCK_ROW = select(Tenant.budget_device_hours).where(
    Tenant.id == bindparam("tenant"),
    func.pg_advisory_xact_lock(func.hashtextextended(bindparam("tenant"), 0)).is_not(None),
)
_TAKE_WRITE_LOCK = (
    update(Tenant)
    .where(Tenant.id == bindparam("tenant"))
    .values(name=Tenant.name)
    .returning(Tenant.budget_device_hours)
)


def _psycopg_query(statement: Select[Any]) -> tuple[str, dict[str, Any]]:
    """`statement` as psycopg's SQL text and its constant parameters, compiled once."""
    compiled = statement.compile(dialect=psycopg_dialect.dialect())
    expanded = compiled.construct_expanded_state({"tenant": "", "up_to": 0})
    return expanded.statement, dict(expanded.parameters)


_LOCK_ROW_SQL = _psycopg_query(_LOCK_ROW)
_OPEN_JOBS_SQL = _psycopg_query(_OPEN_JOBS)

# A tenant refused here is checked again before its next submissions' validation for this
# long (`refused_recently`): a flood of submissions at the limit costs one count each.
RECHECK_AFTER_REFUSAL_S = 30.0
_refused_at: dict[str, float] = {}


def count_open_jobs(session: Session, tenant_id: str, up_to: int) -> int:
    """The tenant's live jobs, counted up to `up_to`."""
    return session.scalar(_OPEN_JOBS, {"tenant": tenant_id, "up_to": up_to}) or 0


def over_limit(count: int, settings: Settings) -> ProblemError | None:
    """429 when `count` other live jobs leave the tenant no place (counted up to the limit)."""
    limit = settings.max_open_jobs_per_tenant
    if count < limit:
        return None
    return too_many(
        f"the tenant has {limit} open jobs or more; the limit is {limit}",
        settings.open_jobs_retry_after_s,
    )


def lock_and_count(session: Session, tenant_id: str, up_to: int) -> tuple[float | None, int]:
    """Serialise this tenant's submissions until the session's transaction ends and count its
    live jobs under that lock, up to `up_to`; returns the tenant's device-hour budget (None:
    no budget), read under the lock, and the count."""
    params = {"tenant": tenant_id, "up_to": up_to}
    if session.get_bind().dialect.name == "sqlite":
        budget = session.scalar(_TAKE_WRITE_LOCK, params)
        return budget, count_open_jobs(session, tenant_id, up_to)
    # psycopg's own connection, in the transaction SQLAlchemy began: SQLAlchemy has no
    # pipeline of its own. Each statement of the pipeline still reads its own snapshot.
    driver = session.connection().connection.driver_connection
    assert driver is not None
    with driver.pipeline():
        lock = driver.execute(_LOCK_ROW_SQL[0], {**_LOCK_ROW_SQL[1], **params})
        count = driver.execute(_OPEN_JOBS_SQL[0], {**_OPEN_JOBS_SQL[1], **params})
    budget_row, count_row = lock.fetchone(), count.fetchone()
    return (budget_row[0] if budget_row else None), (count_row[0] if count_row else 0)


def lock_tenant(session: Session, tenant_id: str) -> None:
    """Serialise the tenant's submissions until the session's transaction ends, with the lock
    the open-jobs count takes: a count of another kind of open work (evaluations, Tinker
    sessions) made under it is exact too."""
    params = {"tenant": tenant_id}
    if session.get_bind().dialect.name == "sqlite":
        session.execute(_TAKE_WRITE_LOCK, params)
    else:
        session.execute(_LOCK_ROW, params)


def refuse_over_limit(tenant_id: str, live: int, settings: Settings) -> None:
    """Under the tenant's lock, once the job is inserted: 429 when the tenant's `live` jobs
    (`lock_and_count`, counted up to the limit + 1), this one included, are over the limit
    (the transaction then rolls the job back)."""
    problem = over_limit(live - 1, settings)
    if problem is not None:
        _refused_at[tenant_id] = time.monotonic()
        raise problem


def refused_recently(tenant_id: str) -> bool:
    """Whether this process refused the tenant within `RECHECK_AFTER_REFUSAL_S`."""
    at = _refused_at.get(tenant_id)
    if at is None:
        return False
    if time.monotonic() - at < RECHECK_AFTER_REFUSAL_S:
        return True
    _refused_at.pop(tenant_id, None)
    return False
