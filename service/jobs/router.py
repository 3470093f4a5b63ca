from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Response
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from service.core.pagination import MAX_ID, MAX_INT, Page, PageDep, paginate
from service.http.deps import (
    ApiKeyDep,
    SessionDep,
    SettingsDep,
    StorageDep,
    TenantDep,
    key_is_valid,
)
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.limits import SubmissionSlot
from service.http.openapi import problems
from service.jobs import service
from service.jobs.deps import check_open_jobs
from service.jobs.downloads import download_response
from service.jobs.estimate import estimate_job as estimate_spec
from service.jobs.events import stream_events
from service.jobs.schemas import (
    CheckpointOut,
    CheckpointsPage,
    EstimateOut,
    EventOut,
    EventsPage,
    JobCreate,
    JobOut,
    JobStatus,
    MetricsPage,
)
from service.models import Job

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)
# `POST /v1/jobs/estimate` (docs/usage.md) stores nothing, so it is no idempotent route; app.py
# mounts it before `router`.
estimate_router = APIRouter(responses=problems(400, 401, 422, 500))


@estimate_router.post("/v1/jobs/estimate", response_model=EstimateOut, tags=["jobs"])
def estimate_job(
    body: JobCreate,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> EstimateOut:
    """The device-seconds and tokens this job spec would take (the body of `POST /v1/jobs`,
    checked as it is; nothing is stored), from your last job or pre-flight on the same model,
    else from the model's size."""
    return estimate_spec(session, storage, settings, tenant, body)


def load_job(job_id: str, session: SessionDep, tenant: TenantDep) -> Job:
    """The job of this tenant, or 404 exactly as for a missing id."""
    return service.get_job(session, tenant, job_id)


JobDep = Annotated[Job, Depends(load_job)]
StepPath = Annotated[
    str, Path(pattern=r"^(latest|[0-9]{1,9})$", description="A step number, or `latest`.")
]


def _out(job: Job) -> JobOut:
    return JobOut.model_validate(job, from_attributes=True)


def _json(job: Job, status_code: int = 200) -> Response:
    """The job as JSON, validated once: the bytes FastAPI would send for `response_model=JobOut`
    (pydantic's JSON, non-finite floats as null) without its second validation pass (which, for
    a sync endpoint, is one more trip through the thread pool)."""
    body = _out(job).model_dump_json(by_alias=True)
    return Response(body, status_code=status_code, media_type="application/json")


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    dependencies=[SubmissionSlot, Idempotent, Depends(check_open_jobs)],
    responses=problems(402, 409, 413, 429),
)
def create_job(
    body: JobCreate,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> Response:
    return _json(service.create_job(session, storage, settings, tenant, body), 201)


@router.get("", response_model=Page[JobOut])
def list_jobs(
    session: SessionDep,
    tenant: TenantDep,
    page: PageDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status.")] = None,
) -> Page[JobOut]:
    stmt = select(Job).where(Job.tenant_id == tenant)
    if status:
        stmt = stmt.where(Job.status == status)
    rows, has_more, nxt = paginate(session, stmt, Job.id, page)
    return Page[JobOut](data=[_out(r) for r in rows], has_more=has_more, next=nxt)


@router.get("/{job_id}", response_model=JobOut, responses=problems(404))
def get_job(job: JobDep) -> Response:
    """The status poll: the same 404 for a missing id or another tenant's job."""
    return _json(job)


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    dependencies=[Idempotent],
    responses=problems(404, 409),
)
def cancel_job(job: JobDep, session: SessionDep) -> Response:
    return _json(service.cancel_job(session, job), 202)


@router.get("/{job_id}/metrics", response_model=MetricsPage, responses=problems(404))
def get_metrics(
    job: JobDep,
    session: SessionDep,
    after_step: Annotated[
        int, Query(ge=0, le=MAX_INT, description="Only steps after this one.")
    ] = 0,
) -> MetricsPage:
    return MetricsPage(
        data=service.list_metrics(session, job, after_step),
        verifiers=job.spec.get("verifiers", []),
        eval_verifiers=job.spec.get("eval_verifiers", []),
    )


@router.get(
    "/{job_id}/events",
    response_model=EventsPage,
    responses={
        200: {
            "description": "Events as JSON, or with `Accept: text/event-stream` a live SSE "
            "stream: one frame per event (`id` = event id, `event` = type, `data` = the "
            "event as JSON), a keep-alive comment when idle, the end when the job is final.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **problems(404),
    },
)
def get_events(
    job: JobDep,
    session: SessionDep,
    settings: SettingsDep,
    api_key: ApiKeyDep,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="Only events after this id.")] = 0,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[
        int | None, Header(ge=0, le=MAX_ID, description="SSE resume point; overrides `after`.")
    ] = None,
) -> EventsPage | StreamingResponse:
    if accept and "text/event-stream" in accept:
        start = last_event_id if last_event_id is not None else after
        # Re-checked every keep-alive: a stream outlives the revocation of its key otherwise.
        authorized = partial(key_is_valid, api_key)
        return StreamingResponse(
            stream_events(job.id, start, settings.sse_keepalive_s, authorized),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    rows = service.list_events(session, job, after)
    return EventsPage(data=[EventOut.model_validate(r, from_attributes=True) for r in rows])


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPage, responses=problems(404))
def list_checkpoints(job: JobDep, session: SessionDep) -> CheckpointsPage:
    rows = service.list_checkpoints(session, job)
    return CheckpointsPage(
        data=[CheckpointOut.model_validate(r, from_attributes=True) for r in rows]
    )


@router.get(
    "/{job_id}/checkpoints/{step}/download",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/x-tar": {}}, "description": "The checkpoint tar."},
        206: {"content": {"application/x-tar": {}}, "description": "The requested byte range."},
        307: {"description": "Redirect to a short-lived presigned URL (S3 storage)."},
        **problems(404, 416),
    },
)
def download_checkpoint(
    job: JobDep,
    step: StepPath,
    session: SessionDep,
    storage: StorageDep,
    settings: SettingsDep,
    range_: Annotated[
        str | None, Header(alias="Range", description="A single `bytes=` range.")
    ] = None,
) -> Response:
    ckpt = service.get_checkpoint(session, job, step)
    return download_response(job, ckpt, storage, settings, range_)


@router.delete(
    "/{job_id}/checkpoints/{step}",
    status_code=204,
    responses={
        204: {"description": "Deleted: the checkpoint's row, then its archive."},
        **problems(404, 409),
    },
)
def delete_checkpoint(
    job: JobDep, step: StepPath, session: SessionDep, storage: StorageDep
) -> Response:
    """Delete a checkpoint (`latest` may stand for the step). 409 while it is the latest of a
    live job (its resume point) or the base model of a live job."""
    service.delete_checkpoint(session, storage, job, step)
    return Response(status_code=204)
