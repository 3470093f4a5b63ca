from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import select

from service.core.pagination import MAX_INT, Page, PageDep, paginate
from service.environments import service
from service.environments.schemas import (
    EnvironmentCreate,
    EnvironmentOut,
    EnvironmentTestRequest,
    EnvironmentTestResult,
)
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.limits import verifier_tests
from service.http.openapi import problems
from service.models import EnvironmentVersion

router = APIRouter(
    prefix="/v1/environments",
    tags=["environments"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)


@router.post(
    "",
    status_code=201,
    response_model=EnvironmentOut,
    dependencies=[Idempotent],
    responses=problems(409, 413, 429),
)
def create_environment(
    body: EnvironmentCreate, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> EnvironmentOut:
    row = service.create_version(session, tenant, body, settings)
    return EnvironmentOut.model_validate(row, from_attributes=True)


@router.get("", response_model=Page[EnvironmentOut])
def list_environments(
    session: SessionDep,
    tenant: TenantDep,
    page: PageDep,
    name: Annotated[str | None, Query(description="Only versions of this name.")] = None,
) -> Page[EnvironmentOut]:
    stmt = select(EnvironmentVersion).where(EnvironmentVersion.tenant_id == tenant)
    if name:
        stmt = stmt.where(EnvironmentVersion.name == name)
    rows, has_more, nxt = paginate(session, stmt, EnvironmentVersion.id, page)
    data = [EnvironmentOut.model_validate(r, from_attributes=True) for r in rows]
    return Page[EnvironmentOut](data=data, has_more=has_more, next=nxt)


@router.get("/{name}", response_model=EnvironmentOut, responses=problems(404))
def get_environment(name: str, session: SessionDep, tenant: TenantDep) -> EnvironmentOut:
    row = service.get_version(session, tenant, name)
    return EnvironmentOut.model_validate(row, from_attributes=True)


@router.get("/{name}/versions/{version}", response_model=EnvironmentOut, responses=problems(404))
def get_environment_version(
    name: str,
    version: Annotated[int, Path(ge=1, le=MAX_INT)],
    session: SessionDep,
    tenant: TenantDep,
) -> EnvironmentOut:
    row = service.get_version(session, tenant, name, version)
    return EnvironmentOut.model_validate(row, from_attributes=True)


@router.post(
    "/{name}/test", response_model=EnvironmentTestResult, responses=problems(404, 413, 429, 503)
)
def test_environment(
    name: str,
    body: EnvironmentTestRequest,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
) -> EnvironmentTestResult:
    """Replay scripted assistant turns through exactly the episode loop training runs, the
    sandbox included: per sample the transcript, the per-turn rewards and their sum."""
    limit = settings.max_concurrent_tests_per_tenant
    with verifier_tests.hold(tenant, limit, "verifier, grader and environment tests"):
        row = service.get_version(session, tenant, name, body.version)
        return service.run_test(session, row, body)
