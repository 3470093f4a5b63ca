"""OpenAPI: documented problem responses for every route, rendered as application/problem+json."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.problems import PROBLEM_JSON, Problem

_DESCRIPTIONS = {
    400: "Malformed request.",
    401: "Missing, invalid or revoked API key.",
    404: "No such object for this tenant (another tenant's id answers exactly the same).",
    409: "Conflict: the object's state forbids it, or an Idempotency-Key reused with another "
    "body (or still in progress).",
    416: "The Range is outside the object.",
    413: "The request body (or a dataset line) is over the configured limit.",
    422: "Validation error: `errors` lists every bad field with its JSON path.",
    429: "Over a per-tenant limit; retry after `Retry-After` seconds.",
    500: "Internal error (never caused by bad input).",
    503: "A dependency is unreachable.",
}

_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer"},
    }
}


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for these statuses, each with the Problem schema."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        out[code] = {"model": Problem, "description": _DESCRIPTIONS[code]}
        if code == 429:
            out[code]["headers"] = _RETRY_AFTER
    return out


def _as_problem_json(schema: dict[str, Any]) -> None:
    """Error responses carry application/problem+json, FastAPI's 422 model becomes Problem."""
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            for code, response in operation.get("responses", {}).items():
                if not code.isdigit() or int(code) < 400:
                    continue
                response["content"] = {PROBLEM_JSON: {"schema": problem_ref}}
                response.setdefault("description", _DESCRIPTIONS.get(int(code), "Error"))
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                openapi_version=app.openapi_version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            _as_problem_json(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
