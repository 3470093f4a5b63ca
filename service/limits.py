"""Request limits: the body size (counted while it streams in), open jobs per tenant, and
concurrent verifier tests per tenant."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import open_jobs
from service.deps import SessionDep, SettingsDep, TenantDep
from service.errors import render_problem
from service.problems import Problem, too_many


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


def check_open_jobs(session: SessionDep, tenant: TenantDep, settings: SettingsDep) -> None:
    """429 with Retry-After when the tenant already has its quota of live jobs: refused before
    the submission is validated. This count takes no lock; the exact check is the locked one
    right before the insert (`service.open_jobs.reserve_open_job`)."""
    problem = open_jobs.over_limit(open_jobs.count_open_jobs(session, tenant), settings)
    if problem is not None:
        raise problem


OpenJobsLimit = Annotated[None, Depends(check_open_jobs)]


class PerTenantSlots:
    """At most `limit` calls at once per tenant in this process: one tenant's slow verifier
    tests cannot take every thread of the API's pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}

    @contextmanager
    def hold(self, tenant: str, limit: int, what: str) -> Iterator[None]:
        with self._lock:
            busy = self._busy.get(tenant, 0)
            if busy >= limit:
                message = f"{busy} {what} already running for this tenant; the limit is {limit}"
                raise too_many(message, 1)
            self._busy[tenant] = busy + 1
        try:
            yield
        finally:
            with self._lock:
                self._busy[tenant] -= 1
                if not self._busy[tenant]:
                    del self._busy[tenant]


verifier_tests = PerTenantSlots()
