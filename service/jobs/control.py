"""Routes that steer a job's lifecycle: pause, resume, fork (docs/lifecycle.md)."""

from fastapi import APIRouter, Depends, Response

from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.openapi import problems
from service.jobs import forks, service
from service.jobs.deps import check_open_jobs
from service.jobs.router import JobDep
from service.jobs.schemas import ForkCreate, JobOut
from service.models import Job

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)


def _json(job: Job, status_code: int = 200) -> Response:
    body = JobOut.model_validate(job, from_attributes=True).model_dump_json(by_alias=True)
    return Response(body, status_code=status_code, media_type="application/json")


@router.post(
    "/{job_id}/pause",
    response_model=JobOut,
    dependencies=[Idempotent],
    responses=problems(404, 409),
)
def pause_job(job: JobDep, session: SessionDep) -> Response:
    """Pause the job: a queued one at once (`paused`); a running one becomes `pausing`, saves
    a checkpoint at its next step boundary, frees its device and becomes `paused`. 409 for a
    job that is pausing, paused or final."""
    return _json(service.pause_job(session, job))


@router.post(
    "/{job_id}/resume",
    response_model=JobOut,
    dependencies=[Idempotent],
    responses=problems(402, 404, 409, 429),
)
def resume_job(job: JobDep, session: SessionDep, settings: SettingsDep) -> Response:
    """Queue a paused job again: it continues from the checkpoint its pause saved, with no
    step lost or repeated. 409 unless it is paused; 429 when the tenant has no open-jobs
    place left."""
    return _json(service.resume_job(session, settings, job))


@router.post(
    "/{job_id}/fork",
    status_code=201,
    response_model=JobOut,
    dependencies=[Idempotent, Depends(check_open_jobs)],
    responses=problems(402, 404, 409, 413, 429),
)
def fork_job(
    job: JobDep,
    body: ForkCreate,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> Response:
    """A new job (new id, status `queued`) that continues this one's training from its
    checkpoint at `step` (404 when that step has none), its spec the parent's with `overrides`
    deep-merged in and validated as POST /v1/jobs validates a body. `forked_from` keeps the
    lineage; the fork point's checkpoint is kept while the fork is unfinished."""
    return _json(forks.fork_job(session, storage, settings, tenant, job, body), 201)
