"""The FastAPI application: routers, error handlers, limits, idempotency, storage, metrics."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth.ratelimit import RateLimitHeaders
from service.catalog.router import router as models_router
from service.core.db import dispose_engine
from service.datasets.router import router as datasets_router
from service.environments.router import router as environments_router
from service.evaluations.router import router as evaluations_router
from service.files.router import router as files_router
from service.fine_tuning.router import router as fine_tuning_router
from service.graders.router import router as graders_router
from service.http import idempotency, openapi
from service.http.api_docs.router import router as docs_router
from service.http.errors import UnhandledErrors, install_error_handlers
from service.http.health import router as health_router
from service.http.json_body import StorableJson
from service.http.limits import BodyLimitMiddleware
from service.http.metrics import MetricsMiddleware, register_collectors
from service.http.wakeups import wake_ups
from service.http.whoami import router as whoami_router
from service.inference.router import router as inference_router
from service.jobs.control import router as job_control_router
from service.jobs.router import estimate_router
from service.jobs.router import router as jobs_router
from service.preflight.router import router as preflight_router
from service.rollouts.dataset_router import router as rollouts_datasets_router
from service.rollouts.router import router as rollouts_router
from service.secrets.router import router as secrets_router
from service.settings import Settings, get_settings, settings_in_force
from service.storage import open_storage_from_settings
from service.tensorboard.router import router as tensorboard_router
from service.tinker.router import router as tinker_router
from service.ui.router import router as ui_router
from service.usage.router import router as usage_router
from service.verifiers.router import router as verifiers_router
from service.webhooks.router import router as webhooks_router

WAKE_UPS_DRAIN_S = 5.0  # at shutdown; what is left then is the reconciler's

DESCRIPTION = """\
GRPO training as a service. Every `/v1` route takes `Authorization: Bearer <api key>`.

Errors are RFC 9457 `application/problem+json`; a validation error lists every bad field with
its JSON path. Creating POSTs accept an `Idempotency-Key` header (the same key and body within
24 h replay the first response; the same key with another body answers 409). Lists page with
`?limit=&after=` and answer `{data, has_more, next}`, newest first.
"""


class SettingsInForce:
    """Puts the app's settings in force (`service.settings.get_settings`) for everything it runs:
    its lifespan, its requests, and the threads and tasks they hand work to."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with settings_in_force(self.settings):
            await self.app(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API with `settings` (by default the process's, from its environment)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.storage = open_storage_from_settings(settings)
        # What the process holds once started (the modules, their tables, the settings) lives
        # as long as it: out of the collector's sight, a full collection scans only what the
        # requests made since: a much shorter stall (bench/README.md, "Figures behind design
        # choices").
        gc.freeze()
        yield
        # Wake-ups of jobs committed just before the shutdown: published, or the reconciler's.
        await anyio.to_thread.run_sync(wake_ups.drain, WAKE_UPS_DRAIN_S)
        dispose_engine(settings.effective_database_url)  # its connections end with it

    app = FastAPI(
        title="grpo-service",
        version="1",
        summary="Training-as-a-service for GRPO reinforcement learning of language models.",
        description=DESCRIPTION,
        lifespan=lifespan,
        # Swagger UI from local files (service/http/api_docs), or not at all; no ReDoc (a CDN's).
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
        # first of every route's dependencies: a JSON body the stores cannot keep is a 422
        dependencies=[StorableJson],
    )
    install_error_handlers(app)
    idempotency.install(app)
    routers = (
        health_router,
        whoami_router,
        models_router,
        verifiers_router,
        graders_router,
        environments_router,
        inference_router,
        rollouts_datasets_router,  # POST /v1/datasets/from-rollouts
        datasets_router,
        files_router,  # before fine_tuning_router (tests/api/test_tenancy.py walks them so)
        fine_tuning_router,
        preflight_router,  # before jobs_router: its paths are under /v1/jobs
        usage_router,
        estimate_router,  # before jobs_router: POST /v1/jobs/estimate
        jobs_router,
        job_control_router,
        rollouts_router,
        evaluations_router,
        secrets_router,
        webhooks_router,
        tensorboard_router,
        tinker_router,  # /api/v1: the Tinker SDK's routes (docs/tinker.md)
    )
    for router in routers:
        app.include_router(router)
    app.include_router(ui_router)
    if settings.docs_enabled:
        app.include_router(docs_router)
    openapi.install(app)
    # First added: innermost, inside every other middleware of ours.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(RateLimitHeaders)
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(UnhandledErrors)
    app.add_middleware(SettingsInForce, settings=settings)  # last added: outermost of ours
    register_collectors()
    return app
