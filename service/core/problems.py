"""RFC 9457 problem details: errors carry their HTTP status, whoever raises them.

No web framework here: services and repositories raise `ProblemError`; the API's one handler
(`service.http.errors`) renders it as problem+json."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PROBLEM_JSON = "application/problem+json"
PROBLEM_TYPE_ROOT = "https://grpo-service.dev/problems/"
# Where a caller finds the names a `model` field takes: the CLI's command and the API route.
MODELS_HINT = "`grpo models` or GET /v1/models lists them"


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
    code: str | None = Field(
        None, description="The problem type's name, snake_case: `model_not_found`, `not_found`."
    )


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
        None,
        description="The same, as OpenAI's SDK reads it (/v1/files, /v1/fine_tuning/jobs, "
        "/v1/chat/completions, /v1/completions).",
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
        kind: str | None = None,
    ) -> None:
        """`kind`: the problem type's name when it says more than the title (`model-not-found`);
        OpenAI's `error.code` is read from it (service.http.openai_errors)."""
        super().__init__(detail)
        kind = kind or title.lower().replace(" ", "-")
        self.problem = Problem(
            type=f"{PROBLEM_TYPE_ROOT}{kind}",
            title=title,
            status=status,
            detail=detail,
            errors=errors,
        )
        self.headers = headers


def not_found(kind: str, ident: str) -> ProblemError:
    return ProblemError(404, "Not Found", f"{kind} '{ident}' not found")


def model_not_found(model: str) -> ProblemError:
    """What OpenAI answers for a `model` it does not serve: 404, code `model_not_found`, param
    `model` (the official SDK's `NotFoundError`)."""
    return ProblemError(
        404,
        "Not Found",
        f"model '{model}' not found ({MODELS_HINT})",
        errors=[FieldError(path="$.model", message=f"no such model ({MODELS_HINT})")],
        kind="model-not-found",
    )


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
