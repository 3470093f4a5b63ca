"""Job events: append-only rows, read as JSON pages or streamed as Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from service.core.db import session_scope
from service.models import FINAL_STATUSES, Job, JobEvent

POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0
RETRY_MS = 2000


def _fetch(job_id: str, after: int) -> tuple[list[dict[str, Any]], bool]:
    """Events after `after`, and whether the job was final before they were read (so that a
    final job's last events are never missed)."""
    from service.jobs.schemas import EventOut

    with session_scope() as session:
        status = session.scalar(select(Job.status).where(Job.id == job_id))
        rows = session.scalars(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.id > after)
            .order_by(JobEvent.id)
            .limit(500)
        )
        events = [
            EventOut.model_validate(r, from_attributes=True).model_dump(mode="json") for r in rows
        ]
    return events, status in FINAL_STATUSES or status is None


def sse_frame(event: dict[str, Any]) -> str:
    return f"id: {event['id']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def stream_events(
    job_id: str,
    after: int,
    keepalive_s: float = KEEPALIVE_SECONDS,
    authorized: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[str]:
    """SSE frames from event `after` on, until the job is final and every event is sent.

    Each frame's `id` is the event id, so a client resumes with `Last-Event-ID`. A comment
    line keeps idle connections (and proxies) alive every `keepalive_s`. Every `keepalive_s`
    the stream also asks `authorized` whether its API key is still valid and ends when it is
    not: a stream can last for hours, and a revoked key must stop reading (a reconnect then
    gets the 401).
    """
    yield f"retry: {RETRY_MS}\n\n"
    last_write = last_check = time.monotonic()
    while True:
        if authorized is not None and time.monotonic() - last_check >= keepalive_s:
            if not await authorized():
                yield ": the API key was revoked\n\n"
                return
            last_check = time.monotonic()
        events, final = await run_in_threadpool(_fetch, job_id, after)
        for event in events:
            after = event["id"]
            yield sse_frame(event)
            last_write = time.monotonic()
        if final and not events:
            return
        if not events and time.monotonic() - last_write >= keepalive_s:
            yield ": keep-alive\n\n"
            last_write = time.monotonic()
        if not events:
            await asyncio.sleep(POLL_SECONDS)
