"""Request dependencies: the unit of work, the tenant behind the API key, storage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.auth.cache import tenant_for_key
from service.db import end_unit_of_work, get_sessionmaker
from service.problems import ProblemError
from service.settings import Settings, get_settings
from service.storage import ObjectStorage


async def get_session() -> AsyncIterator[Session]:
    """The request's unit of work: the one place API writes are committed. Opening a session
    does no I/O (so it happens here, off the thread pool); the commit runs in the pool."""
    session = get_sessionmaker()()
    try:
        yield session
    except BaseException:
        await run_in_threadpool(end_unit_of_work, session, True)
        raise
    await run_in_threadpool(end_unit_of_work, session, False)


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


async def _settings() -> Settings:
    return get_settings()  # async: a cached value needs no trip through the thread pool


SettingsDep = Annotated[Settings, Depends(_settings)]

_bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer grpo_sk_…`")


async def get_tenant(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant behind the bearer key. Looked up in its own short transaction (cached for
    `auth_cache_s`), so the request's session holds no connection until the handler needs one.
    On every request: the settings are read directly (a cached value), not as one more
    dependency to solve."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ProblemError(
            401, "Unauthorized", "missing API key", headers={"WWW-Authenticate": "Bearer"}
        )
    tenant_id = await tenant_for_key(credentials.credentials, get_settings().auth_cache_s)
    if tenant_id is None:
        raise ProblemError(
            401,
            "Unauthorized",
            "invalid or revoked API key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return tenant_id


TenantDep = Annotated[str, Depends(get_tenant)]


def get_storage(request: Request) -> ObjectStorage:
    return request.app.state.storage


StorageDep = Annotated[ObjectStorage, Depends(get_storage)]
