"""RFC 9457 problem+json: errors carry their HTTP status; one handler renders them all."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"


class FieldError(BaseModel):
    path: str
    message: str


class Problem(BaseModel):
    """The body of every error response."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[FieldError] | None = None


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


def _render(problem: Problem, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        return _render(exc.problem, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(path=json_path(e.get("loc", ())), message=e.get("msg", "invalid"))
            for e in exc.errors()
        ]
        return _render(invalid(errors).problem)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        title = {401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed"}.get(
            exc.status_code, "Error"
        )
        problem = Problem(title=title, status=exc.status_code, detail=str(exc.detail))
        return _render(problem, getattr(exc, "headers", None))
