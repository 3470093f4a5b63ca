"""OpenAPI: documented problem responses for every route, rendered as application/problem+json."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.core.problems import PROBLEM_JSON, Problem

_DESCRIPTIONS = {
    400: "Malformed request.",
    401: "Missing, invalid or revoked API key.",
    402: "The tenant's device-hour budget is spent (`detail` says used and limit); the "
    "operator raises or clears it.",
    403: "This API key is read-only (scope `read`): only GET and HEAD.",
    404: "No such object for this tenant (another tenant's id answers exactly the same).",
    409: "Conflict: the object's state forbids it, or an Idempotency-Key reused with another "
    "body (or still in progress).",
    416: "The Range is outside the object.",
    413: "The request body (or a dataset line) is over the configured limit.",
    422: "Validation error: `errors` lists every bad field with its JSON path.",
    429: "Over a per-tenant limit, over this API key's request rate, or too many failed API "
    "key attempts from this address; retry after `Retry-After` seconds.",
    500: "Internal error (never caused by bad input).",
    502: "The inference backend failed (its answer is in `detail`).",
    503: "A dependency is unreachable.",
    504: "The inference backend did not answer in time.",
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


_RATE_LIMIT = {
    "RateLimit-Limit": {
        "description": "Requests this API key may make per minute (when a limit is set).",
        "schema": {"type": "integer"},
    },
    "RateLimit-Remaining": {
        "description": "Requests the key may still make at once.",
        "schema": {"type": "integer"},
    },
    "RateLimit-Reset": {
        "description": "Seconds until the key's allowance is full again.",
        "schema": {"type": "integer"},
    },
}


def _document_auth_throttle(schema: dict[str, Any]) -> None:
    """Every authenticated operation may answer 429 (its client address made too many failed
    API key attempts, service/auth/throttle.py, or the key is over its rate,
    service/auth/ratelimit.py) and sends the RateLimit-* headers; one that is not a GET or
    HEAD answers a read-only key 403."""
    for path_item in schema.get("paths", {}).values():
        for method, operation in path_item.items():
            responses = operation.get("responses", {})
            if "401" not in responses:
                continue
            responses.setdefault("429", {"description": _DESCRIPTIONS[429]})
            responses["429"]["headers"] = {**_RETRY_AFTER, **_RATE_LIMIT}
            if method not in ("get", "head"):
                responses.setdefault("403", {"description": _DESCRIPTIONS[403]})
            for code, response in responses.items():
                if code.startswith("2"):
                    response["headers"] = {**response.get("headers", {}), **_RATE_LIMIT}


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
            _document_auth_throttle(schema)
            _as_problem_json(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
