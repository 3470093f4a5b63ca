"""Request dependencies: the unit of work, the tenant behind the API key, storage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.auth import cache as auth_cache
from service.auth import ratelimit
from service.auth.throttle import admit_client, failed_auth
from service.core.db import end_unit_of_work, get_sessionmaker
from service.core.problems import ProblemError
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


# What a `read` key may do: look, never change.
READ_METHODS = frozenset({"GET", "HEAD"})


async def get_tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant behind the bearer key. Looked up in its own short transaction (cached for
    `auth_cache_s`), so the request's session holds no connection until the handler needs one.
    On every request: the settings are read directly (a cached value), not as one more
    dependency to solve. A client address with too many failed attempts gets 429 for any key
    that is not cached, without a lookup. Then the key's scope (a `read` key changes nothing:
    403) and its rate limit (429; the RateLimit-* headers go out with any answer)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ProblemError(
            401, "Unauthorized", "missing API key", headers={"WWW-Authenticate": "Bearer"}
        )
    return await authenticate(request, credentials.credentials)


async def authenticate(request: Request, secret: str) -> str:
    """The tenant behind `secret`, checked as `get_tenant` describes (also for the Tinker
    routes, whose SDK sends its key in `X-API-Key`)."""
    settings = get_settings()
    key = auth_cache.cached_key(secret, settings.auth_cache_s)
    if key is None:
        host = request.client.host if request.client else None
        client = admit_client(host, settings, "API key attempts")
        key = await auth_cache.lookup(secret, settings.auth_cache_s, settings.auth_cache_entries)
        if key is None:
            failed_auth.failed(client, settings.auth_failure_window_s)
            raise ProblemError(
                401,
                "Unauthorized",
                "invalid or revoked API key",
                headers={"WWW-Authenticate": "Bearer"},
            )
    if key.scope == "read" and request.method not in READ_METHODS:
        raise ProblemError(403, "Forbidden", "this key is read-only")
    headers = await ratelimit.check(key.key_id, settings)
    if headers is not None:
        setattr(request.state, ratelimit.STATE_KEY, headers)  # RateLimitHeaders sends them
    return key.tenant_id


TenantDep = Annotated[str, Depends(get_tenant)]


async def get_api_key(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The bearer key itself, once `get_tenant` has accepted it: a long request (an event
    stream) re-checks it while it runs."""
    return credentials.credentials if credentials is not None else ""


ApiKeyDep = Annotated[str, Depends(get_api_key)]


async def key_is_valid(secret: str) -> bool:
    """Whether the key still authenticates (cached for `auth_cache_s`, as every request)."""
    settings = get_settings()
    key = await auth_cache.key_for_secret(
        secret, settings.auth_cache_s, settings.auth_cache_entries
    )
    return key is not None


async def get_storage(request: Request) -> ObjectStorage:
    return request.app.state.storage


StorageDep = Annotated[ObjectStorage, Depends(get_storage)]
