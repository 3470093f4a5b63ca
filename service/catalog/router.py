from typing import Annotated

from fastapi import APIRouter, Path

from service.catalog import service
from service.catalog.fine_tuned import PREFIX as FINE_TUNED_PREFIX
from service.catalog.fine_tuned import (
    find_fine_tuned,
    fine_tuned_model_name,
    tenant_fine_tuned,
)
from service.catalog.schemas import ModelList, ModelOut
from service.core.problems import model_not_found
from service.http.deps import SessionDep, TenantDep
from service.http.openapi import problems

router = APIRouter(prefix="/v1/models", tags=["models"], responses=problems(400, 401, 422, 500))

# Checkpoints listed at most (newest first): the catalog itself is always listed whole.
MAX_CHECKPOINTS = 500


@router.get("", response_model=ModelList)
def list_models(session: SessionDep, tenant: TenantDep) -> ModelList:
    """The catalog's base models, your fine-tuned models (`ft:…`, from /v1/fine_tuning/jobs),
    then your checkpoints (newest first): each id can be a job's `base_model`."""
    catalog = service.list_models(session)
    roots = {m.name: m for m in catalog}
    checkpoints = service.tenant_checkpoints(session, tenant, MAX_CHECKPOINTS)
    fine_tuned = [
        ModelOut.of_fine_tuned(name, c, j, roots.get(j.base_model or ""))
        for c, j in tenant_fine_tuned(session, tenant, MAX_CHECKPOINTS)
        if (name := fine_tuned_model_name(j)) is not None
    ]
    return ModelList(
        data=[ModelOut.of_catalog(m) for m in catalog]
        + fine_tuned
        + [ModelOut.of_checkpoint(c, j, roots.get(j.base_model or "")) for c, j in checkpoints]
    )


@router.get("/{model:path}", response_model=ModelOut, responses=problems(404))
def get_model(
    model: Annotated[str, Path(max_length=200, description="A model name or checkpoint id.")],
    session: SessionDep,
    tenant: TenantDep,
) -> ModelOut:
    """One catalog model or one of your checkpoints; another tenant's checkpoint is a 404."""
    if model.startswith(FINE_TUNED_PREFIX):
        found = find_fine_tuned(session, tenant, model)
        if found is None:
            raise model_not_found(model)
        ckpt, job = found
        root = service.find_model(session, job.base_model or "")
        return ModelOut.of_fine_tuned(model, ckpt, job, root)
    if model.startswith("ckpt_"):
        found = service.find_tenant_checkpoint(session, tenant, model)
        if found is None:
            raise model_not_found(model)
        ckpt, job = found
        return ModelOut.of_checkpoint(ckpt, job, service.find_model(session, job.base_model or ""))
    return ModelOut.of_catalog(service.get_model(session, model))
