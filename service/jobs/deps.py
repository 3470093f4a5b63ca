"""Request dependencies of the jobs domain: the open-jobs limit checked before a submission
is validated."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.concurrency import run_in_threadpool

from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.jobs import open_jobs


async def check_open_jobs(session: SessionDep, tenant: TenantDep, settings: SettingsDep) -> None:
    """429 with Retry-After, before the submission is validated, for a tenant this process
    refused a moment ago and that still has its quota of live jobs: a flood of submissions at
    the limit costs a count each, not a validation. This count takes no lock; the exact check
    is the locked one after the insert (`service.jobs.open_jobs.refuse_over_limit`), and the only
    one for a tenant under its limit."""
    if not open_jobs.refused_recently(tenant):
        return
    limit = settings.max_open_jobs_per_tenant
    count = await run_in_threadpool(open_jobs.count_open_jobs, session, tenant, limit)
    problem = open_jobs.over_limit(count, settings)
    if problem is not None:
        raise problem


OpenJobsLimit = Annotated[None, Depends(check_open_jobs)]
