"""Probes: liveness and readiness of every dependency (unauthenticated), and Prometheus
metrics (the job and queue gauges only with the operator's token, GRPO_METRICS_TOKEN)."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from sqlalchemy import text

from service.auth.throttle import admit_client, failed_auth
from service.core.db import get_engine
from service.core.problems import ProblemError
from service.http.metrics import OPERATOR_REGISTRY
from service.settings import get_settings
from workers.verifiers import sandbox_memory, sandbox_mode

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
    memory = await run_in_threadpool(sandbox_memory)  # its cgroup, or why only rlimits hold
    body = {
        "ready": ready,
        "checks": checks,
        "verifier_sandbox": sandbox,
        "verifier_sandbox_memory": memory,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


def _operator(request: Request, authorization: str | None) -> bool:
    """Whether the scrape may see the operator's gauges: 401 for a missing or wrong token when
    one is set (counted as a failed attempt of the client address, as a wrong API key is);
    with none set, the scrape gets the request metrics only."""
    settings = get_settings()
    token = settings.metrics_token
    if token is None or not token.get_secret_value():  # `GRPO_METRICS_TOKEN=` is unset too
        return False
    client = admit_client(request.client.host if request.client else None, settings, "attempts")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.get_secret_value().encode()
    ):
        return True
    failed_auth.failed(client, settings.auth_failure_window_s)
    raise ProblemError(
        401,
        "Unauthorized",
        "/metrics needs the operator's token: Authorization: Bearer <GRPO_METRICS_TOKEN>",
        headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."},
        401: {"description": "GRPO_METRICS_TOKEN is set and the bearer token is not it."},
    },
)
async def metrics(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="`Bearer <GRPO_METRICS_TOKEN>`, when one is set.")
    ] = None,
) -> Response:
    """Request counters and latencies by route; with the operator's token (GRPO_METRICS_TOKEN
    set), also jobs by status and queue depths, which show every tenant's activity."""
    operator = _operator(request, authorization)  # on the event loop: the throttle's home
    body = await run_in_threadpool(generate_latest, REGISTRY)
    if operator:  # collected from the database and broker: off the event loop
        body += await run_in_threadpool(generate_latest, OPERATOR_REGISTRY)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
