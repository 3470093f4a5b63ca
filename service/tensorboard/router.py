from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from service.core.problems import not_found
from service.http.content_disposition import attachment
from service.http.deps import StorageDep
from service.http.openapi import problems
from service.jobs.router import JobDep
from service.tensorboard.store import tensorboard_keys, tensorboard_stream

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=problems(400, 401, 422, 500))


@router.get(
    "/{job_id}/tensorboard",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/gzip": {}}, "description": "Every attempt's events."},
        **problems(404),
    },
)
def download_tensorboard(job: JobDep, storage: StorageDep) -> StreamingResponse:
    """The job's TensorBoard event files as one tar.gz (`tar xzf`, then `tensorboard --logdir
    .`), streamed; stored at each checkpoint and at the end. 404 when there are none."""
    keys = tensorboard_keys(storage, job.tenant_id, job.id, job.epoch)
    if not keys:
        raise not_found("tensorboard logs of job", job.id)
    return StreamingResponse(
        tensorboard_stream(storage, job.id, keys),
        media_type="application/gzip",
        headers={"Content-Disposition": attachment(f"{job.id}-tensorboard.tar.gz")},
    )
