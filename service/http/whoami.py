"""`GET /v1/me`: who the bearer key belongs to (the `grpo whoami` of the CLI)."""

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sqlalchemy import select

from service.auth.service import hash_key
from service.core.schemas import UtcDateTime
from service.http.deps import ApiKeyDep, SessionDep, TenantDep
from service.http.openapi import problems
from service.models import ApiKey, Tenant

router = APIRouter(prefix="/v1", tags=["auth"], responses=problems(401, 422, 500))


class KeyOut(BaseModel):
    id: str  # as `grpo-service keys list` shows it
    prefix: str  # the key's public start, as `grpo-service create-api-key` printed it
    scope: str = Field(description="`full`, or `read`: GET and HEAD only.")
    created_at: UtcDateTime
    last_used_at: UtcDateTime | None


class MeOut(BaseModel):
    object: str = "tenant"
    tenant_id: str
    tenant: str
    key: KeyOut


@router.get("/me", response_model=MeOut)
def whoami(session: SessionDep, tenant: TenantDep, secret: ApiKeyDep) -> MeOut:
    """The tenant of this API key, and the key's id, prefix, scope and dates (never the key)."""
    row = session.get(Tenant, tenant)
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
    assert row is not None and key is not None  # get_tenant accepted this very key
    return MeOut(
        tenant_id=row.id,
        tenant=row.name,
        key=KeyOut(
            id=key.id,
            prefix=key.prefix,
            scope=key.scope,
            created_at=key.created_at,
            last_used_at=key.last_used_at,
        ),
    )
