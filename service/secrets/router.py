from typing import Annotated

from fastapi import APIRouter, Path, Response
from sqlalchemy import select

from service.core.pagination import Page, PageDep, paginate
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.openapi import problems
from service.models import TenantSecret
from service.secrets import service
from service.secrets.schemas import SECRET_NAME, SecretCreate, SecretOut

router = APIRouter(prefix="/v1/secrets", tags=["secrets"], responses=problems(400, 401, 422, 500))

SecretName = Annotated[str, Path(pattern=SECRET_NAME)]


def _out(row: TenantSecret) -> SecretOut:
    return SecretOut.model_validate(row, from_attributes=True)


# 200 for a new secret as for a replaced one, and no Idempotency-Key: create-or-replace is
# idempotent already, and the idempotency store would keep a fingerprint of the body (the value).
@router.post("", response_model=SecretOut, responses=problems(413, 503))
def put_secret(
    body: SecretCreate, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> SecretOut:
    """Create a secret, or replace the value of yours of that name (`updated_at` moves). The
    value is stored encrypted and never returned."""
    row, _created = service.put_secret(session, settings, tenant, body.name, body.value)
    return _out(row)


@router.get("", response_model=Page[SecretOut])
def list_secrets(session: SessionDep, tenant: TenantDep, page: PageDep) -> Page[SecretOut]:
    stmt = select(TenantSecret).where(TenantSecret.tenant_id == tenant)
    rows, has_more, nxt = paginate(session, stmt, TenantSecret.id, page)
    return Page[SecretOut](data=[_out(r) for r in rows], has_more=has_more, next=nxt)


@router.delete("/{name}", status_code=204, responses=problems(404))
def delete_secret(name: SecretName, session: SessionDep, tenant: TenantDep) -> Response:
    service.delete_secret(session, tenant, name)
    return Response(status_code=204)
