"""`POST /v1/chat/completions` and `POST /v1/completions`, OpenAI-shaped (the official `openai`
SDK's `chat.completions.create` and `completions.create`): authorised, the model resolved for
the tenant, then proxied to the inference backend; `stream: true` streams its SSE through. The
answers name the model as the caller did (a fine-tuned model's name, not its checkpoint)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from service.core.problems import ProblemError
from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.openapi import problems
from service.inference import fairness, service
from service.inference.disconnect import unless_gone
from service.inference.renaming import renamed_body, renamed_events
from service.inference.schemas import ChatCompletionRequest, CompletionRequest
from service.settings import Settings
from service.storage import ObjectStorage

router = APIRouter(
    prefix="/v1",
    tags=["inference"],
    responses=problems(400, 401, 404, 422, 429, 500, 502, 503, 504),
)

_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "An OpenAI completion object, or with `stream: true` server-sent events: "
        "`data: {chunk}` lines ending with `data: [DONE]`.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


@router.post("/chat/completions", response_class=Response, responses=_OK)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> Response:
    """A chat completion from a catalog model or one of your checkpoints (`model`)."""
    return await _proxy(request, "/v1/chat/completions", body, session, tenant, settings, storage)


@router.post("/completions", response_class=Response, responses=_OK)
async def completions(
    body: CompletionRequest,
    request: Request,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> Response:
    """A text completion from a catalog model or one of your checkpoints (`model`)."""
    return await _proxy(request, "/v1/completions", body, session, tenant, settings, storage)


# What a client that went away gets (nginx's "client closed request"; no one reads it)
_GONE = 499


async def _proxy(
    request: Request,
    path: str,
    body: ChatCompletionRequest | CompletionRequest,
    session: Any,
    tenant: str,
    settings: Settings,
    storage: ObjectStorage,
) -> Response:
    """The backend's answer, its `model` the name the caller used, within the request token
    budget and one of the tenant's inference slots (waited for in the fair queue), held until
    the answer (or its stream) ends (service/inference/fairness.py). A caller that goes away
    closes our request to the backend (it stops decoding: docs/inference.md)."""
    fairness.check_token_budget(body, settings)
    slots = fairness.inference_slots(settings)
    await slots.acquire(tenant)  # at once, or at the tenant's turn in the fair queue
    try:
        response = await _proxy_held(request, path, body, session, tenant, settings, storage)
    except BaseException:
        slots.release(tenant)
        raise
    if isinstance(response, _UpstreamStream):
        response.on_close = lambda: slots.release(tenant)
    else:
        slots.release(tenant)
    return response


async def _proxy_held(
    request: Request,
    path: str,
    body: ChatCompletionRequest | CompletionRequest,
    session: Any,
    tenant: str,
    settings: Settings,
    storage: ObjectStorage,
) -> Response:
    target = await run_in_threadpool(service.resolve, session, tenant, body.model)
    url = service.backend_url(settings) + path
    openai_backend = settings.inference_backend == "openai"
    payload = {**service.forward_body(body), "model": target.model}
    client = _client(settings)
    for retry in (True, False):
        if openai_backend:
            await run_in_threadpool(_prepare, target, settings, storage)
        upstream = client.build_request(
            "POST", url, json=payload, headers=service.headers(settings)
        )
        try:
            here, answer = await unless_gone(request, client.send(upstream, stream=True))
        except httpx.HTTPError as exc:
            raise _transport_problem(exc) from exc
        if not here or answer is None:
            return Response(status_code=_GONE)
        if answer.status_code == 200:
            break
        content = await answer.aread()
        await answer.aclose()
        # a backend that restarted has forgotten the adapters loaded into it: load it again
        if not (retry and openai_backend and answer.status_code == 404):
            raise service.backend_problem(answer.status_code, content)
        if not service.forget_adapter(target):
            raise service.backend_problem(answer.status_code, content)
    assert answer is not None  # the loop above ends on a 200 answer or raises
    rename = body.model if body.model != target.model else None
    if not body.stream:
        try:
            here, answered = await unless_gone(request, answer.aread())
        except httpx.HTTPError as exc:
            raise _transport_problem(exc) from exc
        finally:
            await answer.aclose()
        if not here or answered is None:
            return Response(status_code=_GONE)
        return Response(renamed_body(answered, rename), media_type="application/json")
    return _UpstreamStream(answer, rename)


class _UpstreamStream(StreamingResponse):
    """The backend's SSE, relayed; its connection to the backend closed however the relay
    ends (the client gone included: Starlette cancels the sending, even before the first
    chunk, so the close is shielded from that cancellation)."""

    def __init__(self, answer: httpx.Response, rename: str | None) -> None:
        parts = answer.aiter_raw()
        super().__init__(
            renamed_events(parts, rename) if rename else parts,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.answer = answer
        self.on_close: Callable[[], None] | None = None  # once the relay has ended

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                with anyio.CancelScope(shield=True):
                    await self.answer.aclose()
            finally:
                if self.on_close is not None:
                    self.on_close()


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
