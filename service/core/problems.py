"""RFC 9457 problem details: errors carry their HTTP status, whoever raises them.

No web framework here: services and repositories raise `ProblemError`; the API's one handler
(`service.http.errors`) renders it as problem+json."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PROBLEM_JSON = "application/problem+json"


def status_title(status: int) -> str:
    if status == 413:
        return "Content Too Large"  # RFC 9110's name; older Pythons know only the old one
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class FieldError(BaseModel):
    path: str = Field(description="JSON path of the bad field: `$.grpo.steps`, `query.limit`.")
    message: str


class OpenAIError(BaseModel):
    """OpenAI's error body, which the official `openai` SDK reads (`exc.body`, `.code`,
    `.param`, `.type`): on the OpenAI-compatible routes only (`service.http.openai_errors`)."""

    message: str
    type: str = Field(description="`invalid_request_error`, or `server_error` for a 5xx.")
    param: str | None = Field(None, description="The first bad field, as a dotted path.")
    code: str | None = Field(None, description="The problem's title, snake_case.")


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
    errors: list[FieldError] | None = Field(None, description="Every bad field (a 422; 400s too).")
    error: OpenAIError | None = Field(
        None, description="The same, as OpenAI's SDK reads it (/v1/files, /v1/fine_tuning/jobs)."
    )


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
