"""The FastAPI application: routers, error handlers, limits, idempotency, storage, metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import idempotency, openapi
from service.datasets.router import router as datasets_router
from service.errors import UnhandledErrors, install_error_handlers
from service.health import router as health_router
from service.jobs.router import router as jobs_router
from service.limits import BodyLimitMiddleware
from service.metrics import MetricsMiddleware, register_collectors
from service.settings import Settings, get_settings
from service.storage import open_storage_from_settings
from service.ui.router import router as ui_router
from service.verifiers.router import router as verifiers_router

DESCRIPTION = """\
GRPO training as a service. Every `/v1` route takes `Authorization: Bearer <api key>`.

Errors are RFC 9457 `application/problem+json`; a validation error lists every bad field with
its JSON path. Creating POSTs accept an `Idempotency-Key` header (the same key and body within
24 h replay the first response; the same key with another body answers 409). Lists page with
`?limit=&after=` and answer `{data, has_more, next}`, newest first.
"""


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
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    install_error_handlers(app)
    idempotency.install(app)
    for router in (health_router, verifiers_router, datasets_router, jobs_router):
        app.include_router(router)
    app.include_router(ui_router)
    openapi.install(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(UnhandledErrors)  # last added: outermost of ours
    register_collectors()
    return app
