"""RFC 9457 problem+json: errors carry their HTTP status; one handler renders them all."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger(__name__)


def _title(status: int) -> str:
    if status == 413:
        return "Content Too Large"  # RFC 9110's name; older Pythons know only the old one
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class FieldError(BaseModel):
    path: str = Field(description="JSON path of the bad field: `$.grpo.steps`, `query.limit`.")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details: the body of every error response."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "type": "https://grpo-service.dev/problems/validation-error",
                    "title": "Validation Error",
                    "status": 422,
                    "detail": "$.grpo.steps: Input should be greater than or equal to 1",
                    "errors": [
                        {
                            "path": "$.grpo.steps",
                            "message": "Input should be greater than or equal to 1",
                        }
                    ],
                }
            ]
        }
    )

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[FieldError] | None = Field(None, description="Every bad field (422 only).")


class ProblemError(Exception):
    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.problem = Problem(
            type=f"https://grpo-service.dev/problems/{title.lower().replace(' ', '-')}",
            title=title,
            status=status,
            detail=detail,
            errors=errors,
        )
        self.headers = headers


def not_found(kind: str, ident: str) -> ProblemError:
    return ProblemError(404, "Not Found", f"{kind} '{ident}' not found")


def conflict(detail: str) -> ProblemError:
    return ProblemError(409, "Conflict", detail)


def too_large(detail: str) -> ProblemError:
    return ProblemError(413, "Content Too Large", detail)


def too_many(detail: str, retry_after_s: int) -> ProblemError:
    return ProblemError(
        429, "Too Many Requests", detail, headers={"Retry-After": str(retry_after_s)}
    )


def invalid(errors: list[FieldError], detail: str | None = None) -> ProblemError:
    detail = detail or "; ".join(f"{e.path}: {e.message}" for e in errors)
    return ProblemError(422, "Validation Error", detail, errors=errors)


def json_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """('body', 'grpo', 'steps') -> '$.grpo.steps'; ('query', 'limit') -> 'query.limit'."""
    parts = list(loc)
    root = "$"
    if parts and parts[0] in ("body", "query", "path", "header"):
        where = parts.pop(0)
        root = "$" if where == "body" else where
    out = root
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def render_problem(problem: Problem, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        return render_problem(exc.problem, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(path="$", message=f"invalid JSON: {e.get('ctx', {}).get('error', '')}")
            if e.get("type") == "json_invalid"
            else FieldError(path=json_path(e.get("loc", ())), message=e.get("msg", "invalid"))
            for e in exc.errors()
        ]
        return render_problem(invalid(errors).problem)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        detail = str(exc.detail) if exc.detail else _title(status)
        problem = Problem(title=_title(status), status=status, detail=detail)
        return render_problem(problem, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        # Bad input never lands here: it is a ProblemError or a validation error first.
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        problem = Problem(title=_title(500), status=500, detail="internal server error")
        return render_problem(problem)
