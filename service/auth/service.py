"""API keys: prefixed, 256-bit random, shown once, stored as SHA-256, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ids import new_id
from service.models import ApiKey, Tenant
from service.models.base import utcnow

KEY_PREFIX = "grpo_sk_"
# Refresh last_used_at at most this often, so reads do not turn into a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(id=new_id("ten"), name=name)
        session.add(tenant)
        session.flush()
    return tenant


def create_api_key(session: Session, tenant_name: str) -> str:
    """Create a key for the tenant (created if new); returns the secret, never stored."""
    tenant = get_or_create_tenant(session, tenant_name)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiKey(id=new_id("key"), tenant_id=tenant.id, key_hash=hash_key(secret), prefix=secret[:12])
    )
    session.flush()
    return secret


def revoke_api_key(session: Session, secret_or_prefix: str) -> int:
    """Revoke by full secret or by its displayed prefix; returns how many keys were revoked."""
    if secret_or_prefix.startswith(KEY_PREFIX) and len(secret_or_prefix) > 20:
        keys = session.scalars(select(ApiKey).where(ApiKey.key_hash == hash_key(secret_or_prefix)))
    else:
        keys = session.scalars(select(ApiKey).where(ApiKey.prefix == secret_or_prefix))
    count = 0
    for key in keys:
        if key.revoked_at is None:
            key.revoked_at = utcnow()
            count += 1
    session.flush()
    return count


def authenticate(session: Session, secret: str) -> str | None:
    """The tenant id the key belongs to, or None for an unknown or revoked key."""
    digest = hash_key(secret)
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
    if key is None or key.revoked_at is not None or not hmac.compare_digest(key.key_hash, digest):
        return None
    now = utcnow()
    last = key.last_used_at
    if last is None or now - last.replace(tzinfo=now.tzinfo) > LAST_USED_RESOLUTION:
        key.last_used_at = now
    return key.tenant_id
