"""The FastAPI application: routers, error handlers, storage, request metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from service.datasets.router import router as datasets_router
from service.errors import install_error_handlers
from service.health import LATENCY, REQUESTS
from service.health import router as health_router
from service.jobs.router import router as jobs_router
from service.settings import Settings, get_settings
from service.storage import open_storage_from_settings
from service.verifiers.router import router as verifiers_router


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.storage = open_storage_from_settings(settings)
        yield

    app = FastAPI(
        title="grpo-service",
        version="1",
        summary="Training-as-a-service for GRPO reinforcement learning of language models.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    for router in (health_router, verifiers_router, datasets_router, jobs_router):
        app.include_router(router)

    @app.middleware("http")
    async def record_metrics(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        REQUESTS.labels(request.method, path, response.status_code).inc()
        LATENCY.labels(request.method, path).observe(time.perf_counter() - started)
        return response

    return app
