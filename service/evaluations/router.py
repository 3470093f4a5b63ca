from typing import Annotated

from fastapi import APIRouter, Depends, Path

from service.core.pagination import Page, PageDep
from service.evaluations import service
from service.evaluations.schemas import (
    EvaluationCreate,
    EvaluationOut,
    EvaluationSampleOut,
    EvaluationUsage,
)
from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.openapi import problems
from service.models import Evaluation, EvaluationSample

router = APIRouter(
    prefix="/v1/evaluations",
    tags=["evaluations"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)

EvaluationId = Annotated[str, Path(max_length=64, description="An evaluation id (eval_…).")]


def load_evaluation(
    evaluation_id: EvaluationId, session: SessionDep, tenant: TenantDep
) -> Evaluation:
    """The tenant's evaluation, or 404 exactly as for a missing id."""
    return service.get_evaluation(session, tenant, evaluation_id)


EvaluationDep = Annotated[Evaluation, Depends(load_evaluation)]


def _out(row: Evaluation) -> EvaluationOut:
    spec = row.spec
    return EvaluationOut(
        id=row.id,
        status=row.status,
        model=row.model,
        dataset=spec["dataset"],
        verifiers=spec["verifiers"],
        samples_per_prompt=spec["samples_per_prompt"],
        generation=spec["generation"],
        pass_threshold=spec["pass_threshold"],
        max_records=spec.get("max_records"),
        records=spec["records"],
        seed=spec.get("seed", 0),
        queue=row.queue,
        results=row.results,
        error=row.error,
        usage=EvaluationUsage(
            device_seconds=row.device_seconds, completion_tokens=row.completion_tokens
        ),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _sample(row: EvaluationSample) -> EvaluationSampleOut:
    return EvaluationSampleOut.model_validate(row, from_attributes=True)


@router.post(
    "",
    status_code=201,
    response_model=EvaluationOut,
    dependencies=[Idempotent],
    responses=problems(402, 409, 413, 429),
)
def create_evaluation(
    body: EvaluationCreate,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> EvaluationOut:
    """Queue an evaluation: a worker of `queue` samples the model on the dataset and scores
    every completion; poll `GET /v1/evaluations/{id}` for `results`."""
    return _out(service.submit(session, storage, settings, tenant, body))


@router.get("", response_model=Page[EvaluationOut])
def list_evaluations(session: SessionDep, tenant: TenantDep, page: PageDep) -> Page[EvaluationOut]:
    rows, has_more, nxt = service.list_evaluations(session, tenant, page)
    return Page[EvaluationOut](data=[_out(r) for r in rows], has_more=has_more, next=nxt)


@router.get("/{evaluation_id}", response_model=EvaluationOut, responses=problems(404))
def get_evaluation(evaluation: EvaluationDep) -> EvaluationOut:
    """Its status and, once `succeeded`, `results`: reward_mean, per_verifier and pass_at_k."""
    return _out(evaluation)


@router.post(
    "/{evaluation_id}/cancel",
    status_code=202,
    response_model=EvaluationOut,
    dependencies=[Idempotent],
    responses=problems(404, 409),
)
def cancel_evaluation(evaluation: EvaluationDep, session: SessionDep) -> EvaluationOut:
    """Queued: cancelled now. Running: `cancelling` until its worker has stopped the run. A
    finished evaluation answers 409."""
    return _out(service.cancel(session, evaluation))


@router.get(
    "/{evaluation_id}/samples",
    response_model=Page[EvaluationSampleOut],
    responses=problems(404),
)
def list_samples(
    evaluation: EvaluationDep, session: SessionDep, page: PageDep
) -> Page[EvaluationSampleOut]:
    """Every completion with its verifiers' scores and reward, record by record (`after`: the
    `next` of the previous page). Stored batch by batch while it runs."""
    found, has_more, nxt = service.list_samples(session, evaluation, page)
    return Page[EvaluationSampleOut](data=[_sample(s) for s in found], has_more=has_more, next=nxt)
