"""Request limits: the body size (counted while it streams in), open jobs per tenant,
submissions running at once per process, and concurrent verifier tests per tenant."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import anyio
from anyio.lowlevel import RunVar
from fastapi import Depends
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.problems import Problem, too_many
from service.http.errors import render_problem


class BodyTooLarge(HTTPException):
    """An HTTPException so that FastAPI's body reader lets it through; rendered as a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the limit of {limit} bytes")


class BodyLimitMiddleware:
    """Counts the bytes of every request body as they arrive: a `Content-Length` above the
    limit is refused before reading, and a chunked or lying body is cut off at the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        exc = BodyTooLarge(self.max_bytes)
        problem = Problem(title="Content Too Large", status=413, detail=exc.detail)
        response = render_problem(problem, {"Connection": "close"})
        await response(scope, receive, send)


# Job submissions in flight at once, per process, from their validation to their commit; the
# others wait their turn on the event loop, first come first served (anyio's limiter queues its
# waiters in order). A submission is Python holding the GIL, most of it in the database
# driver: more threads at it do not add CPU, they only slow each other down handing
# the GIL back and forth, the one that holds its tenant's lock at the commit included. Chosen
# with `bench/api_load.py`: 2 served the most creations a second with the shortest p99
# (bench/README.md).
SUBMISSION_CONCURRENCY = 2
_submission_limiter: RunVar[anyio.CapacityLimiter] = RunVar("grpo_submission_limiter")


def loop_limiter(var: RunVar[anyio.CapacityLimiter], tokens: int) -> anyio.CapacityLimiter:
    """The limiter `var` holds in this event loop, made with `tokens` on first use: one per
    event loop, as anyio's own default thread limiter."""
    try:
        return var.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(tokens)
        var.set(limiter)
        return limiter


async def submission_slot() -> AsyncIterator[None]:
    """Held from before the request's session opens until after it commits: list it first in
    a route's dependencies."""
    async with loop_limiter(_submission_limiter, SUBMISSION_CONCURRENCY):
        yield


SubmissionSlot = Depends(submission_slot, scope="function")


class PerTenantSlots:
    """At most `limit` calls at once per tenant in this process: one tenant's slow verifier
    tests cannot take every thread of the API's pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}

    def take(self, tenant: str, limit: int, what: str) -> None:
        """One of the tenant's slots, or a 429 (Retry-After: 1) when all are taken; `release`
        it once done (or use `hold`)."""
        with self._lock:
            busy = self._busy.get(tenant, 0)
            if busy >= limit:
                message = f"{busy} {what} already running for this tenant; the limit is {limit}"
                raise too_many(message, 1)
            self._busy[tenant] = busy + 1

    def release(self, tenant: str) -> None:
        with self._lock:
            self._busy[tenant] -= 1
            if not self._busy[tenant]:
                del self._busy[tenant]

    @contextmanager
    def hold(self, tenant: str, limit: int, what: str) -> Iterator[None]:
        self.take(tenant, limit, what)
        try:
            yield
        finally:
            self.release(tenant)


verifier_tests = PerTenantSlots()
