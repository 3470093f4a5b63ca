"""Unauthenticated probes: liveness, readiness of every dependency, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.db import get_engine
from workers.verifiers import sandbox_mode

router = APIRouter(tags=["health"])


def _check_database() -> None:
    with get_engine().connect() as conn:
        conn.execute(text("SELECT 1"))


def _check_broker() -> None:
    from service.worker import get_celery

    with get_celery().connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: answered on the event loop, needing no thread of the pool and no database."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "a dependency is unreachable"}})
async def readyz(request: Request) -> JSONResponse:
    checks: dict[str, Any] = {}
    probes = {
        "database": _check_database,
        "broker": _check_broker,
        "storage": request.app.state.storage.ping,
    }
    for name, probe in probes.items():
        try:
            await run_in_threadpool(probe)
            checks[name] = "ok"
        except Exception as exc:  # a probe reports, it never raises
            checks[name] = f"error: {type(exc).__name__}: {exc}"[:300]
    ready = all(v == "ok" for v in checks.values())
    # Informational, not a readiness condition: python verifiers need it, other kinds do not.
    sandbox = await run_in_threadpool(sandbox_mode)
    body = {"ready": ready, "checks": checks, "verifier_sandbox": sandbox}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."}},
)
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
