"""The HTTP app of `grpo-service serve`: OpenAI's `/v1/chat/completions` and `/v1/completions`
over the inference engine (workers/inference), for the API to proxy to. Every route but
`/healthz` needs the shared token (`GRPO_INFERENCE_TOKEN`): tenants reach it only through the
API, which authorised the model first. Errors are OpenAI's `{"error": {...}}`."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from service.core.problems import json_path
from service.inference.disconnect import client_gone
from service.inference.schemas import ChatCompletionRequest, CompletionRequest
from service.serve import shapes
from service.serve.resolve import Resolver, UnknownModel
from service.settings import Settings, get_settings
from service.storage import open_storage_from_settings
from workers.inference.engine import Engine
from workers.inference.params import Cancelled, RequestError, Result, Sampling
from workers.inference.params import Request as Generation
from workers.inference.pool import ModelLoadError, ModelPool


class ServeError(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, shapes.error_body(message, kind, code)


def _failure(exc: BaseException) -> ServeError:
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, RequestError):
        return ServeError(400, str(exc), "invalid_request_error", "context_length_exceeded")
    if isinstance(exc, UnknownModel):
        return ServeError(404, str(exc), "invalid_request_error", "model_not_found")
    if isinstance(exc, Cancelled):  # only a client that went away is told (and never reads it)
        return ServeError(499, str(exc), "invalid_request_error", "cancelled")
    if isinstance(exc, ModelLoadError):
        return ServeError(500, str(exc), "server_error", "model_load_failed")
    return ServeError(500, f"generation failed: {exc}", "server_error")


class _Run:
    """The engine's callbacks for one HTTP request's generations, as events on this loop;
    `cancel()` drops them from the engine (their client went away)."""

    def __init__(self, count: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.pending = count
        self.generations: list[Generation] = []

    def cancel(self) -> None:
        for generation in self.generations:
            generation.cancel()

    def _put(self, event: tuple[Any, ...]) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    def request(self, i: int, ref: Any, prompt: Any, sampling: Sampling, n: int) -> Generation:
        generation = Generation(
            ref, prompt, sampling, n,
            on_delta=lambda c, text, lps: self._put(("delta", i, c, text, lps)),
            on_done=lambda result: self._put(("done", i, result)),
            on_error=lambda exc: self._put(("error", i, exc)),
        )  # fmt: skip
        self.generations.append(generation)
        return generation

    async def events(self) -> AsyncIterator[tuple[Any, ...]]:
        while self.pending:
            event = await self.queue.get()
            if event[0] in ("done", "error"):
                self.pending -= 1
            yield event

    async def cancel_when_gone(self, request: Request) -> None:
        """Cancel the generations once the HTTP client has gone (before a response starts)."""
        await client_gone(request)
        self.cancel()


class _CancellingStream(StreamingResponse):
    """A stream whose generations are cancelled however it ends: its client gone (Starlette
    cancels the sending), a failed send, or the last chunk sent (nothing left to cancel)."""

    def __init__(self, content: AsyncIterator[bytes], run: _Run) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})  # fmt: skip
        self.run = run

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.cancel()


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def create_serve_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if settings.inference_token is None:
        raise RuntimeError("serve needs GRPO_INFERENCE_TOKEN (the API sends the same value)")
    token = settings.inference_token.get_secret_value().encode()
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = ModelPool(settings.serve_max_models, settings.serve_max_adapters,
                         settings.serve_device)  # fmt: skip
        state["resolver"] = Resolver(settings, open_storage_from_settings(settings))
        state["engine"] = Engine(pool, settings.serve_batch_window_ms / 1000,
                                 settings.serve_max_batch)  # fmt: skip
        yield
        state["engine"].close()

    async def authorised(request: Request) -> None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), b"Bearer " + token):
            raise ServeError(401, "invalid inference token", "invalid_request_error")

    app = FastAPI(title="grpo-service serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    auth = [Depends(authorised)]

    @app.exception_handler(ServeError)
    async def _serve_error(_: Request, exc: ServeError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(f"{json_path(e['loc'])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(shapes.error_body(detail, "invalid_request_error"), status_code=400)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health", dependencies=auth)
    async def health() -> dict[str, Any]:
        engine: Engine = state["engine"]
        return {"status": "ok", "pool": engine.pool.describe(), "engine": vars(engine.stats)}

    @app.post("/v1/chat/completions", response_model=None, dependencies=auth)
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        prompt = [{"role": m.role, "content": m.text()} for m in body.messages]
        sampling = _sampling(body, body.token_cap(), body.logprob_k())
        return await _generate(request, "chat", body, [prompt], sampling)

    @app.post("/v1/completions", response_model=None, dependencies=auth)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        sampling = _sampling(body, body.max_tokens, body.logprobs)
        return await _generate(request, "text", body, list(body.prompts()), sampling)

    async def _generate(
        request: Request, kind: str, body: Any, prompts: list[Any], sampling: Sampling
    ) -> Any:
        try:
            ref = await run_in_threadpool(state["resolver"].resolve, body.model)
        except Exception as exc:  # noqa: BLE001 - unknown model, storage down
            raise _failure(exc) from exc
        run = _Run(len(prompts))
        for i, prompt in enumerate(prompts):
            state["engine"].submit(run.request(i, ref, prompt, sampling, body.n))
        events = run.events()
        # Until the response starts, a client that goes away is noticed here; once a stream
        # runs, Starlette notices and _CancellingStream cancels.
        watcher = asyncio.create_task(run.cancel_when_gone(request))
        try:
            if not body.stream:
                return JSONResponse(await _whole(kind, body, sampling, events, len(prompts)))
            first = await anext(events)
            if first[0] == "error":
                raise _failure(first[2])
        except BaseException:  # a failure (or the task cancelled): the other prompts stop too
            run.cancel()
            raise
        finally:
            watcher.cancel()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(kind, body, sampling, first, events, include_usage)
        return _CancellingStream(stream, run)

    return app


def _sampling(body: Any, max_tokens: int | None, logprobs: int | None) -> Sampling:
    return Sampling(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=tuple(body.stops()),
        seed=body.seed,
        logprobs=logprobs,
    )


async def _whole(
    kind: str, body: Any, sampling: Sampling, events: AsyncIterator[tuple[Any, ...]], count: int
) -> dict[str, Any]:
    results: list[Result | None] = [None] * count
    async for event in events:
        if event[0] == "error":
            raise _failure(event[2])
        if event[0] == "done":
            results[event[1]] = event[2]
    done = [r for r in results if r is not None]
    with_lp = sampling.logprobs is not None
    build = shapes.chat_choice if kind == "chat" else shapes.text_choice
    choices = [
        build(c, p * body.n + c.index, with_lp) for p, r in enumerate(done) for c in r.choices
    ]
    use = shapes.usage(sum(r.prompt_tokens for r in done), sum(r.completion_tokens for r in done))
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return shapes.completion(kind, shapes.new_id(prefix), body.model, choices, use)


async def _stream(
    kind: str,
    body: Any,
    sampling: Sampling,
    first: tuple[Any, ...],
    events: AsyncIterator[tuple[Any, ...]],
    include_usage: bool,
) -> AsyncIterator[bytes]:
    cid = shapes.new_id("chatcmpl" if kind == "chat" else "cmpl")
    started: set[int] = set()
    prompt_tokens = completion_tokens = 0

    async def all_events() -> AsyncIterator[tuple[Any, ...]]:
        yield first
        async for e in events:
            yield e

    async for event in all_events():
        if event[0] == "error":
            failure = _failure(event[2])
            yield _sse(failure.body)  # the SDK raises APIError on an `error` chunk
            return
        if event[0] == "delta":
            _, p, c, text, lps = event
            index = p * body.n + c
            choice = shapes.delta_choice(kind, index, text, lps, role=index not in started)
            started.add(index)
            yield _sse(shapes.chunk(kind, cid, body.model, [choice]))
            continue
        _, p, result = event
        prompt_tokens += result.prompt_tokens
        completion_tokens += result.completion_tokens
        for c in result.choices:
            index = p * body.n + c.index
            end = shapes.delta_choice(kind, index, None if kind == "chat" else "", None,
                                      c.finish_reason, role=index not in started)  # fmt: skip
            yield _sse(shapes.chunk(kind, cid, body.model, [end]))
    if include_usage:
        yield _sse(
            shapes.chunk(kind, cid, body.model, [], shapes.usage(prompt_tokens, completion_tokens))
        )
    yield b"data: [DONE]\n\n"


def app_from_env() -> FastAPI:
    """uvicorn's factory (`--factory service.serve.app:app_from_env`)."""
    return create_serve_app()
