from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from service.core.pagination import MAX_INT, Page, PageDep
from service.http.content_disposition import attachment
from service.http.deps import SessionDep, StorageDep
from service.http.openapi import problems
from service.jobs.router import JobDep
from service.rollouts import service
from service.rollouts.format import PARQUET_MEDIA_TYPE
from service.rollouts.schemas import RolloutFilters, RolloutOut, Split

router = APIRouter(prefix="/v1/jobs", tags=["rollouts"], responses=problems(400, 401, 422, 500))


@router.get("/{job_id}/rollouts", response_model=Page[RolloutOut], responses=problems(404))
def list_rollouts(
    job: JobDep,
    session: SessionDep,
    storage: StorageDep,
    page: PageDep,
    step: Annotated[int | None, Query(ge=1, le=MAX_INT, description="Only this step.")] = None,
    split: Annotated[Split | None, Query(description="Only training or eval rows.")] = None,
    record: Annotated[
        int | None, Query(ge=0, le=MAX_INT, description="Only completions of this record.")
    ] = None,
    min_reward: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_reward: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    verifier_error: Annotated[
        bool | None, Query(description="true: only rows a verifier failed on; false: none.")
    ] = None,
) -> Page[RolloutOut]:
    """The completions the job's steps sampled, by step, then train before eval, then group
    and index. A step with no stored rollouts gives an empty page."""
    filters = RolloutFilters(
        step=step, split=split, record=record, min_reward=min_reward, max_reward=max_reward,
        verifier_error=verifier_error,
    )  # fmt: skip
    rows, has_more, nxt = service.list_rollouts(
        session, storage, job, filters, page.limit, page.after
    )
    return Page[RolloutOut](data=[RolloutOut(**r) for r in rows], has_more=has_more, next=nxt)


@router.get(
    "/{job_id}/rollouts/download",
    response_class=StreamingResponse,
    responses={
        200: {"content": {PARQUET_MEDIA_TYPE: {}}, "description": "Every stored row, one file."},
        **problems(404),
    },
)
def download_rollouts(
    job: JobDep,
    session: SessionDep,
    storage: StorageDep,
    split: Annotated[Split | None, Query(description="Only training or eval rows.")] = None,
) -> StreamingResponse:
    """All of the job's stored rollouts as one Parquet file (a row group per step), streamed."""
    keys = service.download_keys(session, job, split)
    name = f"{job.id}-rollouts{f'-{split}' if split else ''}.parquet"
    return StreamingResponse(
        service.download_stream(storage, keys),
        media_type=PARQUET_MEDIA_TYPE,
        headers={"Content-Disposition": attachment(name)},
    )
