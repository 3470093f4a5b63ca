"""Tenant secrets: create or replace, list, delete; decrypted only for a worker's job."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.core.db import rows_matched
from service.core.ids import new_id
from service.core.problems import ProblemError, not_found
from service.models import TenantSecret
from service.models.base import utcnow
from service.secrets import crypto
from service.settings import Settings


def _sealed(settings: Settings, tenant_id: str, name: str, value: str) -> bytes:
    try:
        return crypto.encrypt(settings, tenant_id, name, value)
    except crypto.SecretsUnavailable as exc:
        raise ProblemError(503, "Service Unavailable", str(exc)) from None


def find_secret(session: Session, tenant_id: str, name: str) -> TenantSecret | None:
    return session.scalar(
        select(TenantSecret).where(TenantSecret.tenant_id == tenant_id, TenantSecret.name == name)
    )


def put_secret(
    session: Session, settings: Settings, tenant_id: str, name: str, value: str
) -> tuple[TenantSecret, bool]:
    """Create the secret, or replace its value; (row, created)."""
    ciphertext = _sealed(settings, tenant_id, name, value)
    row = find_secret(session, tenant_id, name)
    if row is None:
        row = TenantSecret(id=new_id("sec"), tenant_id=tenant_id, name=name, ciphertext=ciphertext)
        try:
            with session.begin_nested():  # a concurrent create of the same name: replace it
                session.add(row)
                session.flush()
            return row, True
        except IntegrityError:
            row = find_secret(session, tenant_id, name)
            assert row is not None
    row.ciphertext, row.updated_at = ciphertext, utcnow()
    session.flush()
    return row, False


def delete_secret(session: Session, tenant_id: str, name: str) -> None:
    deleted = rows_matched(
        session.execute(
            delete(TenantSecret)
            .where(TenantSecret.tenant_id == tenant_id, TenantSecret.name == name)
            .execution_options(synchronize_session=False)
        )
    )
    if not deleted:  # another tenant's secret of that name is just as missing
        raise not_found("secret", name)


def reveal(session: Session, settings: Settings, tenant_id: str, name: str) -> str | None:
    """The plaintext, for a worker running a job of `tenant_id`; None if there is none. Never
    log it, never put it in an event or a metric."""
    row = find_secret(session, tenant_id, name)
    if row is None:
        return None
    return crypto.decrypt(settings, tenant_id, name, row.ciphertext)
