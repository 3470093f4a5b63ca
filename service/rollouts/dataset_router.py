"""`POST /v1/datasets/from-rollouts`: here, beside the rollouts it reads, since the datasets
package sits below jobs (jobs import it) and may not import them back."""

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from service.datasets.schemas import DatasetOut
from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.openapi import problems
from service.rollouts.datasets import dataset_from_rollouts
from service.rollouts.schemas import FromRollouts

router = APIRouter(
    prefix="/v1/datasets",
    tags=["datasets"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)


@router.post(
    "/from-rollouts",
    status_code=201,
    response_model=DatasetOut,
    dependencies=[Idempotent],
    responses=problems(404, 409, 413),
)
async def create_from_rollouts(
    body: FromRollouts,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> DatasetOut:
    """A dataset of the job's stored rollouts: `sft` records `{prompt, completion, reward}`, or
    `dpo` records `{prompt, chosen, rejected}` (best and worst of each group whose rewards
    differ). A job of another tenant answers 404 as a missing one does."""
    row = await run_in_threadpool(dataset_from_rollouts, session, storage, settings, tenant, body)
    return DatasetOut.model_validate(row, from_attributes=True)
