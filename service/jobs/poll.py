"""The status poll (`GET /v1/jobs/{id}`), the API's hot path: its read, and an ASGI fast path
that answers it before FastAPI's router.

Profiled under `bench/api_load.py` (py-spy, bench/README.md), a poll through FastAPI spent
most of its time in the framework: matching the path against every route before this one,
solving the dependencies, the trip through the thread pool and back, the route's own
wrappers. `PollFastPath` answers the common case itself, inside every middleware of ours
(the metrics, the RateLimit-* headers, the body limit, the last-resort 500): a GET of
`/v1/jobs/{id}` with no query and no body, by a key whose lookup is cached. It checks what
the route checks (the key, the rate limit, text the stores cannot keep), reads the job's row
on the event loop (psycopg's async connection, on PostgreSQL) and answers the bytes the route
answers. Every other request, and any of these the fast path is unsure of (a key not cached,
an id with a NUL), goes on to the router unchanged, which answers it as before.

On PostgreSQL a job's 200 answer is then kept for up to a second, per process, and dropped as
soon as PostgreSQL notifies a change of its row (`service.jobs.poll_cache`: its rules); a poll
of a job that has not changed costs no database round trip. SQLite (embedded mode) has no
notifications and no cache: every poll reads.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import psycopg
from anyio.lowlevel import RunVar
from fastapi.security.utils import get_authorization_scheme_param
from psycopg.rows import dict_row
from sqlalchemy import bindparam, make_url, select
from sqlalchemy.exc import DBAPIError
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth import cache as auth_cache
from service.auth import ratelimit
from service.core.db import get_read_engine
from service.core.problems import ProblemError, not_found
from service.core.text import text_problem
from service.http.errors import DATABASE_UNAVAILABLE, database_unavailable, render_problem
from service.http.limits import loop_limiter
from service.jobs.poll_cache import PollCache
from service.jobs.schemas import JobOut
from service.models import Job
from service.settings import get_settings

# The status poll reads just the columns JobOut shows, with Core (no ORM identity map);
# built once, with bound parameters: no statement to build or cache key to compute per poll.
POLL = select(*(Job.__table__.c[name] for name in JobOut.model_fields)).where(
    Job.__table__.c.id == bindparam("job_id"), Job.__table__.c.tenant_id == bindparam("tenant")
)

# Status polls reading at once, per process: well under the engine's pool_size (10), so that a
# burst of polls never checks out overflow connections (each one opened and closed again: a
# PostgreSQL backend forked per burst); a poll beyond it waits its turn on the event loop. The
# value was chosen with `bench/api_load.py`: both fewer and more served fewer polls a second,
# and more also lengthened the p99 (bench/README.md).
POLL_CONCURRENCY = 4
_poll_limiter: RunVar[anyio.CapacityLimiter] = RunVar("grpo_poll_limiter")
_PATH = re.compile(r"/v1/jobs/([^/]+)")


def render_job(row: Any) -> Response:
    body = JobOut.model_validate(row, from_attributes=True).model_dump_json(by_alias=True)
    return Response(body, media_type="application/json")


def _read_row(tenant: str, job_id: str) -> Any:
    """One short read on the read engine (autocommit, no pre-ping: one database round trip). A
    connection the database dropped fails the first try; the read is simply made again."""
    for attempt in range(2):
        try:
            with get_read_engine(POLL_CONCURRENCY).connect() as conn:
                return conn.execute(POLL, {"job_id": job_id, "tenant": tenant}).first()
        except DBAPIError as exc:
            if attempt or not exc.connection_invalidated:
                raise
    raise AssertionError("unreachable")


def read_job_sync(tenant: str, job_id: str) -> Response:
    """The poll's answer, read in the calling thread; 404 for a missing id and for another
    tenant's job alike (as `service.get_job`)."""
    row = _read_row(tenant, job_id)
    if row is None:
        raise not_found("job", job_id)
    return render_job(row)


def poll_limiter() -> anyio.CapacityLimiter:
    return loop_limiter(_poll_limiter, POLL_CONCURRENCY)


class AsyncReads:
    """PostgreSQL reads on the event loop: up to POLL_CONCURRENCY autocommit connections of
    psycopg's async driver, opened with the arguments SQLAlchemy's engine uses. A read that
    finds its connection dead (the database restarted, a backend terminated) closes every idle
    one and is made once more, on a new connection. One per event loop; asyncio's own
    primitives (anyio's limiter and run variable cost a third of a read's CPU)."""

    def __init__(self, connect_args: tuple[list[Any], dict[str, Any]], sql: str) -> None:
        self._args, self._kwargs = connect_args
        self._sql = sql
        self._idle: list[psycopg.AsyncConnection[dict[str, Any]]] = []
        self._slots = asyncio.Semaphore(POLL_CONCURRENCY)
        self.cache = PollCache(connect_args)  # this event loop's answers (service.jobs.poll_cache)

    async def _connect(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        return await psycopg.AsyncConnection.connect(
            *self._args, **self._kwargs, autocommit=True, row_factory=dict_row
        )

    async def fetch(self, params: dict[str, str]) -> dict[str, Any] | None:
        async with self._slots:
            for attempt in range(2):
                reused = bool(self._idle)
                conn = self._idle.pop() if reused else await self._connect()
                try:
                    cursor = await conn.execute(self._sql, params)
                    row = await cursor.fetchone()
                except psycopg.OperationalError:
                    await conn.close()
                    if attempt or not reused:
                        raise
                    while self._idle:  # as old as the dead one: likely dead too
                        await self._idle.pop().close()
                    continue
                except BaseException:
                    await conn.close()  # cancelled mid-read: its state is unknown
                    raise
                self._idle.append(conn)
                return row
        raise AssertionError("unreachable")


_async_reads: tuple[asyncio.AbstractEventLoop, AsyncReads | None] | None = None


def _reads() -> AsyncReads | None:
    """This event loop's async reader; None when the database is not PostgreSQL on psycopg
    (SQLite: the read goes through the thread pool)."""
    global _async_reads
    loop = asyncio.get_running_loop()
    if _async_reads is not None and _async_reads[0] is loop:
        return _async_reads[1]
    engine = get_read_engine(POLL_CONCURRENCY)
    reads = None
    if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg":
        url = make_url(get_settings().effective_database_url)
        sql = str(POLL.compile(dialect=engine.dialect))
        reads = AsyncReads(engine.dialect.create_connect_args(url), sql)
        reads.cache.start()
    _async_reads = (loop, reads)
    return reads


async def read_job(tenant: str, job_id: str) -> Response:
    reads = _reads()
    if reads is None:
        return await anyio.to_thread.run_sync(read_job_sync, tenant, job_id, limiter=poll_limiter())
    cached = reads.cache.get(tenant, job_id)
    if cached is not None:
        return Response(cached, media_type="application/json")
    generation = reads.cache.generation  # taken before the read: see PollCache.store
    row = await reads.fetch({"job_id": job_id, "tenant": tenant})
    if row is None:
        raise not_found("job", job_id)
    response = render_job(row)
    reads.cache.store(tenant, job_id, bytes(response.body), generation)
    return response


def _bearer(scope: Scope) -> str | None:
    """The request's bearer key, when it has one and no body; else None."""
    secret = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, credentials = get_authorization_scheme_param(value.decode("latin-1"))
            if scheme.lower() != "bearer" or not credentials or secret is not None:
                return None
            secret = credentials
        elif name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return None
    return secret


class PollFastPath:
    """Answers `GET /v1/jobs/{id}` before the router when it can (the module's docstring);
    passes everything else on. Added first, so every other middleware of the app wraps it.
    `route` is the status poll's own: the request is labelled with it (the metrics), as the
    router does. No route before it in the app may take a GET of `/v1/jobs/{one segment}`
    (tests/api/test_status_poll.py checks the app's routes)."""

    def __init__(self, app: ASGIApp, route: BaseRoute) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope["query_string"]:
            found = _PATH.fullmatch(scope["path"])
            if found is not None and not scope.get("root_path"):
                answer = await self._answer(scope, found.group(1))
                if answer is not None:
                    await answer(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _answer(
        self, scope: Scope, job_id: str
    ) -> Callable[[Scope, Receive, Send], Awaitable[None]] | None:
        secret = _bearer(scope)
        if secret is None or text_problem(job_id) is not None:
            return None
        settings = get_settings()
        key = auth_cache.cached_key(secret, settings.auth_cache_s)
        if key is None:  # the router's path: the lookup, the failed-auth throttle
            return None
        scope["route"] = self.route  # what the metrics label the request by
        try:
            headers = await ratelimit.check(key.key_id, settings)
            if headers is not None:  # RateLimitHeaders (outside) sends them
                scope.setdefault("state", {})[ratelimit.STATE_KEY] = headers
            return await read_job(key.tenant_id, job_id)
        except ProblemError as exc:  # the same problem+json the app's handler renders
            return render_problem(exc.problem, exc.headers)
        except DATABASE_UNAVAILABLE as exc:  # as the app's handler: 503, not a 500
            return database_unavailable(exc)
