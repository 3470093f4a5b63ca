"""The open-jobs limit, exact: a submission counts its tenant's live jobs and inserts its own
under a per-tenant lock held until its transaction commits, so two racing submissions can never
both take the last place.

On PostgreSQL the lock is the tenant's row (`SELECT … FOR NO KEY UPDATE`: it serialises one
tenant's submissions but, unlike `FOR UPDATE`, does not block inserts whose foreign keys point
at the tenant, such as its dataset uploads). SQLite has no row locks: a no-op `UPDATE` of the
tenant row takes the database's write lock, which every other writer then waits for
(`busy_timeout`), and the count that follows runs in that same write transaction.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from service.models import LIVE_STATUSES, Job, Tenant
from service.problems import ProblemError, too_many
from service.settings import Settings

# Built once, with a bound parameter: no statement to build or cache key to compute per request.
_OPEN_JOBS = (
    select(func.count())
    .select_from(Job)
    .where(Job.tenant_id == bindparam("tenant"), Job.status.in_(LIVE_STATUSES))
)
_LOCK_ROW = (
    select(Tenant.id).where(Tenant.id == bindparam("tenant")).with_for_update(key_share=True)
)
_TAKE_WRITE_LOCK = update(Tenant).where(Tenant.id == bindparam("tenant")).values(name=Tenant.name)


def count_open_jobs(session: Session, tenant_id: str) -> int:
    return session.scalar(_OPEN_JOBS, {"tenant": tenant_id}) or 0


def over_limit(count: int, settings: Settings) -> ProblemError | None:
    limit = settings.max_open_jobs_per_tenant
    if count < limit:
        return None
    return too_many(
        f"the tenant has {count} open jobs; the limit is {limit}", settings.open_jobs_retry_after_s
    )


def lock_tenant(session: Session, tenant_id: str) -> None:
    """Serialise this tenant's submissions until the session's transaction ends."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(_TAKE_WRITE_LOCK, {"tenant": tenant_id})
    else:
        session.execute(_LOCK_ROW, {"tenant": tenant_id})


def reserve_open_job(session: Session, tenant_id: str, settings: Settings) -> None:
    """Call right before inserting the job, in its transaction: 429 when the tenant has no
    place left. The lock is taken as late as possible, after the submission's validation,
    so that it is held only for the insert and the commit."""
    lock_tenant(session, tenant_id)
    problem = over_limit(count_open_jobs(session, tenant_id), settings)
    if problem is not None:
        raise problem
