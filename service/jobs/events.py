"""Job events: append-only rows, read as JSON pages or streamed as Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db import session_scope
from service.models import FINAL_STATUSES, Job, JobEvent

POLL_SECONDS = 0.5


def add_event(
    session: Session, job_id: str, type_: str, message: str, data: dict[str, Any] | None = None
) -> None:
    session.add(JobEvent(job_id=job_id, type=type_, message=message, data=data or {}))


def _fetch(job_id: str, after: int) -> tuple[list[dict[str, Any]], bool]:
    from service.jobs.schemas import EventOut

    with session_scope() as session:
        rows = session.scalars(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.id > after)
            .order_by(JobEvent.id)
        )
        events = [
            EventOut.model_validate(r, from_attributes=True).model_dump(mode="json") for r in rows
        ]
        status = session.scalar(select(Job.status).where(Job.id == job_id))
    return events, status in FINAL_STATUSES


async def stream_events(job_id: str, after: int) -> AsyncIterator[str]:
    """SSE frames until the job is final and every event has been sent; ids allow resuming."""
    while True:
        events, final = await run_in_threadpool(_fetch, job_id, after)
        for event in events:
            after = event["id"]
            yield f"id: {event['id']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"
        if final and not events:
            return
        if not events:
            yield ": keep-alive\n\n"
        await asyncio.sleep(POLL_SECONDS)
