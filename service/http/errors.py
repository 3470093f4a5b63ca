"""problem+json responses: one handler renders every error the API raises or meets."""

from __future__ import annotations

import logging

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.problems import (
    PROBLEM_JSON,
    FieldError,
    Problem,
    ProblemError,
    invalid,
    status_title,
)
from service.core.pydantic_errors import field_errors
from service.http.openai_errors import wants_openai_error, with_openai_error

log = logging.getLogger(__name__)
POOL_RETRY_AFTER_S = 1
DATABASE_RETRY_AFTER_S = 2
# What the database driver raises when the database cannot be reached (down, restarting, not
# accepting connections) or gives up on a statement: SQLAlchemy's wrapper, and psycopg's own
# where psycopg is used directly (the open-jobs pipeline, `service.jobs.open_jobs`).
DATABASE_UNAVAILABLE = (OperationalError, psycopg.OperationalError)


def render_problem(
    problem: Problem, headers: dict[str, str] | None = None, request: Request | None = None
) -> JSONResponse:
    """The problem as problem+json; on an OpenAI-compatible route (`request`'s path) with
    OpenAI's `error` member too."""
    if request is not None and wants_openai_error(request.url.path):
        problem = with_openai_error(problem)
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model the request's route reads its body into (for "did you mean")."""
    field = getattr(request.scope.get("route"), "body_field", None)
    annotation = field.field_info.annotation if field is not None else None
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


def database_unavailable(exc: BaseException) -> JSONResponse:
    """503 with Retry-After: the database is out of reach for now. Nothing was stored (the
    request's transaction never committed), so the client retries as for any 503."""
    log.warning("database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
    problem = Problem(
        title=status_title(503), status=503, detail="the database is unreachable: retry shortly"
    )
    return render_problem(problem, {"Retry-After": str(DATABASE_RETRY_AFTER_S)})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return render_problem(exc.problem, exc.headers, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        model = body_model(request)
        errors = [
            FieldError(path="$", message=f"invalid JSON: {e.get('ctx', {}).get('error', '')}")
            if e.get("type") == "json_invalid"
            else field_errors([e], model)[0]
            for e in exc.errors()
        ]
        return render_problem(invalid(errors).problem, request=request)

    @app.exception_handler(PoolTimeout)
    async def _pool_exhausted(_: Request, exc: PoolTimeout) -> JSONResponse:
        # A burst larger than the connection pool: the request waited its turn for the pool's
        # timeout. Busy, not broken: the client retries.
        log.warning("database pool exhausted: %s", exc)
        problem = Problem(
            title=status_title(503), status=503, detail="the service is busy: retry shortly"
        )
        return render_problem(problem, {"Retry-After": str(POOL_RETRY_AFTER_S)})

    for error in DATABASE_UNAVAILABLE:

        @app.exception_handler(error)
        async def _database(_: Request, exc: Exception) -> JSONResponse:
            return database_unavailable(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        detail = str(exc.detail) if exc.detail else status_title(status)
        problem = Problem(title=status_title(status), status=status, detail=detail)
        return render_problem(problem, getattr(exc, "headers", None), request)


class UnhandledErrors:
    """Outermost of the app's middlewares but `SettingsInForce` (which only sets the settings):
    an unexpected error becomes a 500 problem, logged, and is not raised further. Starlette's
    own last-resort handler answers too but re-raises, and uvicorn then closes the connection:
    the client's next request on it failed with a reset. A response already under way cannot
    be replaced: that error is raised as before."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            log.error("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
            problem = Problem(title=status_title(500), status=500, detail="internal server error")
            await render_problem(problem)(scope, receive, send)
