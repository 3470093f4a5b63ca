"""OpenAI's `/v1/fine_tuning/jobs` (the official `openai` SDK's `fine_tuning.jobs`), method
`reinforcement`, over our jobs: create, list, retrieve, cancel, pause, resume, events and
checkpoints. docs/fine-tuning.md maps the fields."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from service.core.pagination import PageDep
from service.fine_tuning import history, service
from service.fine_tuning.progress import progress_of
from service.fine_tuning.schemas import (
    CheckpointList,
    FineTuningEventList,
    FineTuningJobCreate,
    FineTuningJobList,
    FineTuningJobOut,
)
from service.fine_tuning.views import checkpoint_view, event_view, job_view
from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.limits import SubmissionSlot
from service.http.openapi import problems
from service.jobs import service as jobs
from service.jobs.deps import check_open_jobs
from service.models import Job

router = APIRouter(
    prefix="/v1/fine_tuning/jobs",
    tags=["fine-tuning"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)


def load_fine_tuning_job(fine_tuning_job_id: str, session: SessionDep, tenant: TenantDep) -> Job:
    """The tenant's fine-tuning job, or 404 exactly as for a missing id."""
    return service.get_job(session, tenant, fine_tuning_job_id)


FineTuningJobDep = Annotated[Job, Depends(load_fine_tuning_job)]


def _view(session: SessionDep, job: Job) -> FineTuningJobOut:
    """The job as OpenAI shows it, its trained tokens and estimated finish from our records."""
    session.flush()  # a transition just made (cancel, pause) is what the estimate reads
    return job_view(job, progress_of(session, [job])[job.id])


Limit = Annotated[int, Query(ge=1, le=100, description="Page size.")]
After = Annotated[
    str | None,
    Query(pattern=r"^[A-Za-z0-9_.\-]{1,128}$", description="The last id of the previous page."),
]


@router.post(
    "",
    status_code=201,
    response_model=FineTuningJobOut,
    dependencies=[SubmissionSlot, Idempotent, Depends(check_open_jobs)],
    responses=problems(402, 409, 413, 429),
)
def create_fine_tuning_job(
    body: FineTuningJobCreate,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> FineTuningJobOut:
    """A reinforcement fine-tuning job: one of our jobs (GET /v1/jobs/{job}), its grader a
    verifier, its hyperparameters GRPO knobs. 400 for another method, an unknown grader type
    or a template field the files lack."""
    return _view(session, service.create_job(session, storage, settings, tenant, body))


@router.get("", response_model=FineTuningJobList)
def list_fine_tuning_jobs(
    session: SessionDep, tenant: TenantDep, page: PageDep
) -> FineTuningJobList:
    rows, has_more, nxt = service.list_jobs(session, tenant, page)
    progress = progress_of(session, rows)
    data = [job_view(r, progress[r.id]) for r in rows]
    return FineTuningJobList(data=data, has_more=has_more, next=nxt)


@router.get("/{fine_tuning_job_id}", response_model=FineTuningJobOut, responses=problems(404))
def get_fine_tuning_job(job: FineTuningJobDep, session: SessionDep) -> FineTuningJobOut:
    """`trained_tokens`: the tokens its recorded steps trained so far (null before the first);
    `estimated_finish`: while running, now plus the remaining steps at its recent step time."""
    return _view(session, job)


@router.post(
    "/{fine_tuning_job_id}/cancel",
    response_model=FineTuningJobOut,
    dependencies=[Idempotent],
    responses=problems(404, 409),
)
def cancel_fine_tuning_job(job: FineTuningJobDep, session: SessionDep) -> FineTuningJobOut:
    """As POST /v1/jobs/{id}/cancel: a queued job is cancelled at once, a running one stops at
    its next step (`running` until then). 409 for a finished job."""
    with service.named_as_openai(job):
        changed = jobs.cancel_job(session, job)
    return _view(session, changed)


@router.post(
    "/{fine_tuning_job_id}/pause",
    response_model=FineTuningJobOut,
    dependencies=[Idempotent],
    responses=problems(404, 409),
)
def pause_fine_tuning_job(job: FineTuningJobDep, session: SessionDep) -> FineTuningJobOut:
    """As POST /v1/jobs/{id}/pause: `paused` once its checkpoint is saved."""
    with service.named_as_openai(job):
        changed = jobs.pause_job(session, job)
    return _view(session, changed)


@router.post(
    "/{fine_tuning_job_id}/resume",
    response_model=FineTuningJobOut,
    dependencies=[Idempotent],
    responses=problems(402, 404, 409, 429),
)
def resume_fine_tuning_job(
    job: FineTuningJobDep, session: SessionDep, settings: SettingsDep
) -> FineTuningJobOut:
    """As POST /v1/jobs/{id}/resume: a paused job is queued again, from its checkpoint."""
    with service.named_as_openai(job):
        changed = jobs.resume_job(session, settings, job)
    return _view(session, changed)


@router.get(
    "/{fine_tuning_job_id}/events", response_model=FineTuningEventList, responses=problems(404)
)
def list_fine_tuning_events(
    job: FineTuningJobDep, session: SessionDep, limit: Limit = 20, after: After = None
) -> FineTuningEventList:
    """Our job's events (GET /v1/jobs/{id}/events), newest first."""
    rows, has_more = history.list_events(session, job, after, limit)
    return FineTuningEventList(data=[event_view(r) for r in rows], has_more=has_more)


@router.get(
    "/{fine_tuning_job_id}/checkpoints", response_model=CheckpointList, responses=problems(404)
)
def list_fine_tuning_checkpoints(
    job: FineTuningJobDep, session: SessionDep, limit: Limit = 10, after: After = None
) -> CheckpointList:
    """Our job's checkpoints, newest first, with the metrics of their step."""
    rows, has_more = history.list_checkpoints(session, job, after, limit)
    data = [checkpoint_view(c, job, m) for c, m in rows]
    return CheckpointList(data=data, has_more=has_more)
