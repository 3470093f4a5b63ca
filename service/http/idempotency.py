"""Idempotency keys on creating POSTs, Stripe's semantics.

Per tenant, kept 24 h, bound to a fingerprint of the request (method, path, body). The first
request claims the key by inserting its row in a short transaction of its own: the primary key
is the lock, so of many concurrent duplicates exactly one runs. The winner's 2xx response is
written into the row inside the request's own transaction, so the object and the stored
response commit together; an error response or a rollback releases the key for a retry. A
duplicate waits briefly for the winner and replays its response (`Idempotent-Replayed: true`),
or answers 409 while it is still running; the same key with another body answers 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError

from service.core.db import after_rollback, session_scope
from service.core.problems import FieldError, ProblemError, conflict, invalid
from service.core.text import text_problem
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.json_body import is_json, read_json
from service.models import IdempotencyKey
from service.models.base import aware, utcnow

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
POLL_SECONDS = 0.05
PURGE_PROBABILITY = 0.01
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"


@dataclass(frozen=True)
class Claim:
    tenant_id: str
    key: str


class Replay(Exception):
    """Answer with the stored first response."""

    def __init__(self, status_code: int, body: Any) -> None:
        self.status_code, self.body = status_code, body


async def fingerprint(request: Request) -> str:
    """SHA-256 of method, path and body. JSON is canonicalised (key order, spacing); multipart
    loses its random boundary, so a client re-posting the same file matches."""
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    if "json" in content_type:
        with contextlib.suppress(ValueError):
            body = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    elif content_type.startswith("multipart/") and "boundary=" in content_type:
        boundary = content_type.split("boundary=", 1)[1].split(";")[0].strip('"')
        body = body.replace(boundary.encode(), b"")
    digest = hashlib.sha256(f"{request.method} {request.url.path}\n".encode())
    digest.update(body)
    return digest.hexdigest()


def _insert(claim: Claim, method_path: str, digest: str) -> bool:
    """Claim the key by inserting its row; False when the key is taken."""
    try:
        with session_scope() as s:
            s.add(
                IdempotencyKey(
                    tenant_id=claim.tenant_id,
                    key=claim.key,
                    method_path=method_path,
                    fingerprint=digest,
                )
            )
        return True
    except IntegrityError:
        return False


def _load(claim: Claim) -> IdempotencyKey | None:
    with session_scope() as s:
        row = s.get(IdempotencyKey, (claim.tenant_id, claim.key))
        if row is not None:
            s.expunge(row)
        return row


def _purge(before: datetime) -> None:
    """Forget keys older than the TTL (now and then, on a claim: no cron needed)."""
    with session_scope() as s:
        s.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < before))


def _drop(claim: Claim, created_at: datetime | None = None) -> None:
    """Release a claim (or drop an expired row: only if it is still the one we saw)."""
    with session_scope() as s:
        stmt = delete(IdempotencyKey).where(
            IdempotencyKey.tenant_id == claim.tenant_id, IdempotencyKey.key == claim.key
        )
        if created_at is None:
            stmt = stmt.where(IdempotencyKey.status_code.is_(None))
        else:
            stmt = stmt.where(IdempotencyKey.created_at == created_at)
        s.execute(stmt)


async def acquire(claim: Claim, method_path: str, digest: str, settings: Any) -> None:
    """Claim the key, or raise Replay / a 409 problem."""
    ttl = timedelta(seconds=settings.idempotency_ttl_s)
    lock = timedelta(seconds=settings.idempotency_lock_s)
    deadline = asyncio.get_running_loop().time() + settings.idempotency_wait_s
    while True:
        row = await run_in_threadpool(_load, claim)
        if row is None:
            if await run_in_threadpool(_insert, claim, method_path, digest):
                if random.random() < PURGE_PROBABILITY:
                    await run_in_threadpool(_purge, utcnow() - ttl)
                return
            continue  # lost the race to a concurrent duplicate: read its row
        age = utcnow() - aware(row.created_at)
        if age > ttl or (row.status_code is None and age > lock):
            await run_in_threadpool(_drop, claim, row.created_at)  # expired, or its API died
            continue
        if (row.method_path, row.fingerprint) != (method_path, digest):
            raise conflict(
                f"Idempotency-Key '{claim.key}' was used for another request "
                f"({row.method_path}, another body); use a new key"
            )
        if row.status_code is not None:
            raise Replay(row.status_code, row.response)
        if asyncio.get_running_loop().time() >= deadline:
            raise ProblemError(
                409,
                "Conflict",
                f"a request with Idempotency-Key '{claim.key}' is still in progress",
                headers={"Retry-After": "1"},
            )
        await asyncio.sleep(POLL_SECONDS)


def _store(session: Any, claim: Claim, response: Response, unstored: tuple[str, ...]) -> None:
    body = json.loads(bytes(response.body))
    for name in unstored:  # a secret shown once: a replay answers null in its place
        if isinstance(body, dict) and name in body:
            body[name] = None
    session.execute(
        update(IdempotencyKey)
        .where(IdempotencyKey.tenant_id == claim.tenant_id, IdempotencyKey.key == claim.key)
        .values(status_code=response.status_code, response=body, completed_at=utcnow())
    )


async def idempotency(
    request: Request,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            pattern=KEY_PATTERN,
            description="Makes the POST safe to retry: the same key and body within 24 h "
            "replay the first response (with `Idempotent-Replayed: true`); the same key with "
            "another body answers 409. Use a fresh random value (a UUID) per operation.",
            examples=["6f1c2a0e-9b7d-4c55-8f3e-2d4b7a9e1c03"],
        ),
    ] = None,
) -> AsyncIterator[None]:
    if idempotency_key is None:
        yield
        return
    claim = Claim(tenant, idempotency_key)
    await acquire(
        claim, f"{request.method} {request.url.path}", await fingerprint(request), settings
    )
    request.state.idempotency = claim
    try:
        yield
    except BaseException:
        await run_in_threadpool(_drop, claim)
        raise
    response: Response | None = getattr(request.state, "idempotency_response", None)
    if response is None or not 200 <= response.status_code < 300:
        await run_in_threadpool(_drop, claim)
        return
    # Stored in the request's transaction: the response commits with what it describes.
    unstored = getattr(request.state, "idempotency_unstored", ())
    await run_in_threadpool(_store, session, claim, response, unstored)
    after_rollback(session, lambda: _drop(claim))


Idempotent = Depends(idempotency, scope="function")


class IdempotentRoute(APIRoute):
    """Refuses text the stores cannot keep (`service.core.text`) in the path, the query and the
    idempotency key, and reads a JSON body (`service.http.json_body`, which checks it), before
    any dependency runs; hands the endpoint's response to the idempotency dependency before its
    teardown."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        parse_json = not getattr(self.endpoint, "reads_its_body", False)
        unstored: tuple[str, ...] = getattr(self.endpoint, "replayed_without", ())

        async def capture(request: Request) -> Response:
            _refuse_unstorable_params(request)
            if parse_json and is_json(request):
                await read_json(request)  # before FastAPI reads it: off the event loop if large
            response = await handler(request)
            if getattr(request.state, "idempotency", None) is not None:
                request.state.idempotency_response = response
                request.state.idempotency_unstored = unstored
            return response

        return capture


def replayed_without(*fields: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark an endpoint whose answer holds a secret shown once (`POST /v1/webhooks`): the
    idempotency store keeps the answer with those top-level fields set to null, and a replay
    answers so, rather than keeping the secret in plain text for 24 h."""

    def mark(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        endpoint.replayed_without = fields  # type: ignore[attr-defined]
        return endpoint

    return mark


def _refuse_unstorable_params(request: Request) -> None:
    fields = [
        *(("path", k, v) for k, v in request.path_params.items()),
        *(("query", k, v) for k, v in request.query_params.multi_items()),
        *(("header", HEADER, v) for v in request.headers.getlist(HEADER)),
    ]
    errors = [
        FieldError(path=f"{where}.{name}", message=message)
        for where, name, value in fields
        if isinstance(value, str) and (message := text_problem(value))
    ]
    if errors:
        raise invalid(errors)


def install(app: FastAPI) -> None:
    @app.exception_handler(Replay)
    async def _replay(_: Request, exc: Replay) -> JSONResponse:
        return JSONResponse(
            exc.body, status_code=exc.status_code, headers={REPLAYED_HEADER: "true"}
        )
