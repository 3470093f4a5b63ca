"""API keys: prefixed, 256-bit random, shown once, stored as SHA-256, compared in constant time.
A key's scope is `full` or `read` (GET and HEAD only)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.models import ApiKey, Tenant
from service.models.base import utcnow

KEY_PREFIX = "grpo_sk_"
# Refresh last_used_at at most this often, so reads do not turn into a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
Scope = Literal["full", "read"]
SCOPES: tuple[str, ...] = get_args(Scope)


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """What an accepted key is: whose, which one (the rate limit counts per key), and what it
    may do."""

    key_id: str
    tenant_id: str
    scope: str


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(id=new_id("ten"), name=name)
        session.add(tenant)
        session.flush()
    return tenant


def new_api_key(session: Session, tenant_name: str, scope: str = "full") -> tuple[ApiKey, str]:
    """Create a key for the tenant (created if new); returns it and the secret, never stored."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    tenant = get_or_create_tenant(session, tenant_name)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"),
        tenant_id=tenant.id,
        key_hash=hash_key(secret),
        prefix=secret[:12],
        scope=scope,
    )
    session.add(key)
    session.flush()
    return key, secret


def create_api_key(session: Session, tenant_name: str, scope: str = "full") -> str:
    """Create a key for the tenant (created if new); returns the secret, never stored."""
    return new_api_key(session, tenant_name, scope)[1]


def list_api_keys(session: Session, tenant_name: str | None = None) -> list[tuple[ApiKey, str]]:
    """Every key (of one tenant) with its tenant's name, newest first."""
    stmt = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
    if tenant_name is not None:
        stmt = stmt.where(Tenant.name == tenant_name)
    rows = session.execute(stmt.order_by(ApiKey.created_at.desc(), ApiKey.id.desc()))
    return [(key, name) for key, name in rows]


def revoke_api_key(session: Session, key: str) -> int:
    """Revoke by key id (`key_…`), full secret or displayed prefix; returns how many keys were
    revoked. Processes that cached the key stop accepting it within `auth_cache_s`."""
    if key.startswith(KEY_PREFIX) and len(key) > 20:
        keys = session.scalars(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))
    elif key.startswith("key_"):
        keys = session.scalars(select(ApiKey).where(ApiKey.id == key))
    else:
        keys = session.scalars(select(ApiKey).where(ApiKey.prefix == key))
    count = 0
    for row in keys:
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            count += 1
    session.flush()
    return count


def authenticate(session: Session, secret: str) -> KeyIdentity | None:
    """The key's identity (tenant, id, scope), or None for an unknown or revoked key."""
    digest = hash_key(secret)
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
    if key is None or key.revoked_at is not None or not hmac.compare_digest(key.key_hash, digest):
        return None
    now = utcnow()
    last = key.last_used_at
    if last is None or now - last.replace(tzinfo=now.tzinfo) > LAST_USED_RESOLUTION:
        key.last_used_at = now
    return KeyIdentity(key.id, key.tenant_id, key.scope)
