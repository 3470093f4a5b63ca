"""`POST /v1/chat/completions` and `POST /v1/completions`, OpenAI-shaped (the official `openai`
SDK's `chat.completions.create` and `completions.create`): authorised, the model resolved for
the tenant, then proxied to the inference backend; `stream: true` streams its SSE through."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from service.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.inference import service
from service.inference.schemas import ChatCompletionRequest, CompletionRequest
from service.openapi import problems
from service.problems import ProblemError
from service.settings import Settings
from service.storage import ObjectStorage

router = APIRouter(
    prefix="/v1", tags=["inference"], responses=problems(400, 401, 404, 422, 500, 502, 503, 504)
)

_OK = {
    200: {
        "description": "An OpenAI completion object, or with `stream: true` server-sent events: "
        "`data: {chunk}` lines ending with `data: [DONE]`.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


@router.post("/chat/completions", response_class=Response, responses=_OK)
async def chat_completions(
    body: ChatCompletionRequest,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> Response:
    """A chat completion from a catalog model or one of your checkpoints (`model`)."""
    return await _proxy("/v1/chat/completions", body, session, tenant, settings, storage)


@router.post("/completions", response_class=Response, responses=_OK)
async def completions(
    body: CompletionRequest,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> Response:
    """A text completion from a catalog model or one of your checkpoints (`model`)."""
    return await _proxy("/v1/completions", body, session, tenant, settings, storage)


async def _proxy(
    path: str,
    body: ChatCompletionRequest | CompletionRequest,
    session: Any,
    tenant: str,
    settings: Settings,
    storage: ObjectStorage,
) -> Response:
    target = await run_in_threadpool(service.resolve, session, tenant, body.model)
    url = service.backend_url(settings) + path
    if settings.inference_backend == "openai":
        await run_in_threadpool(_prepare, target, settings, storage)
    payload = {**service.forward_body(body), "model": target.model}
    client = _client(settings)
    request = client.build_request("POST", url, json=payload, headers=service.headers(settings))
    try:
        answer = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise _transport_problem(exc) from exc
    if answer.status_code != 200:
        content = await answer.aread()
        await answer.aclose()
        raise service.backend_problem(answer.status_code, content)
    if not body.stream:
        try:
            content = await answer.aread()
        except httpx.HTTPError as exc:
            raise _transport_problem(exc) from exc
        finally:
            await answer.aclose()
        return Response(content, media_type="application/json")

    async def relay() -> AsyncIterator[bytes]:
        try:  # closed however the stream ends, a client that went away included
            async for part in answer.aiter_raw():
                yield part
        finally:
            await answer.aclose()

    return StreamingResponse(
        relay(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# One connection pool per event loop (uvicorn runs one): a client per request would build an
# SSL context and a connection each time, the largest part of the proxy's cost.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def _client(settings: Settings) -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        timeout = httpx.Timeout(settings.inference_timeout_s, connect=5.0)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        client = _clients[loop] = httpx.AsyncClient(timeout=timeout, limits=limits)
    return client


def _prepare(target: service.Target, settings: Settings, storage: ObjectStorage) -> None:
    timeout = httpx.Timeout(settings.inference_timeout_s, connect=5.0)
    try:
        with httpx.Client(timeout=timeout) as client:
            service.prepare_openai_adapter(target, settings, storage, client)
    except httpx.HTTPError as exc:
        raise _transport_problem(exc) from exc


def _transport_problem(exc: httpx.HTTPError) -> ProblemError:
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return ProblemError(504, "Gateway Timeout", "the inference backend did not answer in time")
    return service.unavailable(f"the inference backend is unreachable: {exc}")
