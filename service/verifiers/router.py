from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import select

from service.core.pagination import MAX_INT, Page, PageDep, paginate
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.limits import verifier_tests
from service.http.openapi import problems
from service.models import VerifierVersion
from service.verifiers import service
from service.verifiers.limits import check_test_cap
from service.verifiers.schemas import (
    VerifierCreate,
    VerifierOut,
    VerifierTestRequest,
    VerifierTestResult,
)

router = APIRouter(
    prefix="/v1/verifiers",
    tags=["verifiers"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)


@router.post(
    "",
    status_code=201,
    response_model=VerifierOut,
    dependencies=[Idempotent],
    responses=problems(409, 413, 429),
)
def create_verifier(
    body: VerifierCreate, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> VerifierOut:
    row = service.create_version(session, tenant, body, settings)
    return VerifierOut.model_validate(row, from_attributes=True)


@router.get("", response_model=Page[VerifierOut])
def list_verifiers(
    session: SessionDep,
    tenant: TenantDep,
    page: PageDep,
    name: Annotated[str | None, Query(description="Only versions of this name.")] = None,
) -> Page[VerifierOut]:
    stmt = select(VerifierVersion).where(VerifierVersion.tenant_id == tenant)
    if name:
        stmt = stmt.where(VerifierVersion.name == name)
    rows, has_more, nxt = paginate(session, stmt, VerifierVersion.id, page)
    data = [VerifierOut.model_validate(r, from_attributes=True) for r in rows]
    return Page[VerifierOut](data=data, has_more=has_more, next=nxt)


@router.get("/{name}", response_model=VerifierOut, responses=problems(404))
def get_verifier(name: str, session: SessionDep, tenant: TenantDep) -> VerifierOut:
    row = service.get_version(session, tenant, name)
    return VerifierOut.model_validate(row, from_attributes=True)


@router.get("/{name}/versions/{version}", response_model=VerifierOut, responses=problems(404))
def get_verifier_version(
    name: str,
    version: Annotated[int, Path(ge=1, le=MAX_INT)],
    session: SessionDep,
    tenant: TenantDep,
) -> VerifierOut:
    row = service.get_version(session, tenant, name, version)
    return VerifierOut.model_validate(row, from_attributes=True)


@router.post("/{name}/test", response_model=VerifierTestResult, responses=problems(404, 413))
def test_verifier(
    name: str,
    body: VerifierTestRequest,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
) -> VerifierTestResult:
    limit = settings.max_concurrent_tests_per_tenant
    with verifier_tests.hold(tenant, limit, "verifier tests"):
        row = service.get_version(session, tenant, name, body.version)
        check_test_cap(row.kind, row.config, service.make_resolver(session, tenant), settings)
        return service.run_test(session, row, body, settings)
