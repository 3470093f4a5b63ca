from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.concurrency import run_in_threadpool

from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.openapi import problems
from service.jobs.schemas import JobCreate
from service.models import PREFLIGHT_FINAL, Preflight
from service.preflight import service
from service.preflight.schemas import PreflightOut

# Registered before the jobs router: `/v1/jobs/preflight...` is never read as a job id.
router = APIRouter(
    prefix="/v1/jobs/preflight",
    tags=["jobs"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)

PreflightId = Annotated[str, Path(max_length=64, description="A pre-flight id (pf_…).")]


def _json(row: Preflight, status_code: int = 200) -> Response:
    out = PreflightOut.model_validate({
        **{c: getattr(row, c) for c in ("id", "status", "queue", "spec", "error",
                                         "memory_estimate", "created_at", "started_at",
                                         "finished_at")},
        **(row.result or {}),
        "memory_estimate": row.memory_estimate,
    })  # fmt: skip
    headers = {}
    if status_code == 202:
        headers = {"Location": f"{router.prefix}/{row.id}", "Retry-After": "2"}
    body = out.model_dump_json()
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)


@router.post(
    "",
    response_model=PreflightOut,
    dependencies=[Idempotent],
    responses={
        200: {"description": "The pre-flight has finished: `succeeded` (figures, warnings) or "
              "`failed` (`error`)."},
        202: {
            "model": PreflightOut,
            "description": "Not finished within GRPO_PREFLIGHT_WAIT_S: poll `Location`.",
            "headers": {"Location": {"schema": {"type": "string"}},
                        "Retry-After": {"schema": {"type": "integer"}}},
        },
        **problems(402, 409, 413, 429, 503),
    },
)  # fmt: skip
async def create_preflight(
    body: JobCreate,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> Response:
    """Run the spec of a `POST /v1/jobs` (same body, same validation, 422 alike) for one real
    GRPO step on a few prompts on a worker of its queue, without creating a job. Waits up to
    GRPO_PREFLIGHT_WAIT_S for the outcome (200), else answers 202 with `Location`."""
    row = await run_in_threadpool(service.submit, session, storage, settings, tenant, body)
    row = await service.wait_final(row, settings)
    return _json(row, 200 if row.status in PREFLIGHT_FINAL else 202)


@router.get("/{preflight_id}", response_model=PreflightOut, responses=problems(404))
def get_preflight(
    preflight_id: PreflightId, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> Response:
    """A pre-flight of yours; another tenant's answers 404 exactly as a missing one."""
    return _json(service.get_preflight(session, tenant, preflight_id, settings))
