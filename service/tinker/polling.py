"""retrieve_future's long-poll: read the request's row every `_STEP_S` (each read its own short
transaction, so a waiting request holds no connection), up to GRPO_TINKER_LONG_POLL_S, then
answer what the SDK expects: the result (protobuf for a forward/backward or a sample, as the SDK
asks), a failure `{error, category}`, or `try_again` with the request's place in the queue."""

from __future__ import annotations

import itertools
import time
from typing import Any

import anyio
from fastapi import Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from service.core.db import session_scope
from service.models import TinkerRequest
from service.settings import get_settings
from service.tinker import futures, schemas, wire

_STEP_S = (0.02, 0.05, 0.1, 0.2)  # quick at first: most steps on a small model are short
_ENCODERS = {
    "forward": wire.encode_forward_backward_output,
    "forward_backward": wire.encode_forward_backward_output,
    "sample": wire.encode_sample_response,
}


def _read(tenant_id: str, request_id: str) -> tuple[TinkerRequest, int]:
    with session_scope() as session:
        row = futures.load(session, tenant_id, request_id)
        ahead = futures.queue_position(session, row) if row.status in futures.OPEN else 0
        session.expunge(row)
        return row, ahead


async def wait(tenant_id: str, request_id: str) -> tuple[TinkerRequest, int]:
    deadline = time.monotonic() + get_settings().tinker_long_poll_s
    pauses = itertools.chain(_STEP_S, itertools.repeat(_STEP_S[-1]))
    while True:
        row, ahead = await run_in_threadpool(_read, tenant_id, request_id)
        if row.status not in futures.OPEN or time.monotonic() >= deadline:
            return row, ahead
        await anyio.sleep(next(pauses))


def answer(found: tuple[TinkerRequest, int], protobuf: bool) -> Response:
    row, ahead = found
    if row.status in futures.OPEN:
        reason = "running" if row.status == "running" else f"queued, {ahead} of yours ahead"
        body = schemas.TryAgain(request_id=row.id, queue_state_reason=reason, queue_position=ahead)
        return JSONResponse(body.model_dump())
    if row.status == "failed":
        return JSONResponse(row.error or {"error": "failed", "category": "unknown"})
    result: dict[str, Any] = row.result or {}
    encode = _ENCODERS.get(row.kind)
    if encode is not None and protobuf:
        return Response(encode(result), media_type="application/x-protobuf")
    return JSONResponse(result)
