"""Every JSON request body read once and checked once, for every route of the app.

`refuse_unstorable_json` is a dependency of the whole app (`create_app`): a body holding what
the stores cannot keep (`service.core.text`: NaN, Infinity, a NUL character, a lone
surrogate) is a 422 naming each such value's path, with the body's other faults beside them
(its model's own errors), before any other dependency runs and before a handler uses it.
PostgreSQL refused each of them, as a 500, on the routes that did not check (issue 46 item 8).
A new route is covered without a word; an endpoint that parses its own body as it streams
(`reads_its_body`) checks what it reads itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from service.core.problems import FieldError, invalid
from service.core.pydantic_errors import field_errors
from service.core.text import unstorable_values
from service.http.errors import body_model

# A JSON body up to this size is parsed on the event loop (well under a millisecond): a trip
# through the thread pool would cost more than the parse.
PARSE_INLINE_BYTES = 64 * 1024


def reads_its_body(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an endpoint that parses (and checks) its own body, as it streams: the app then
    never parses it whole (`POST /v1/datasets`, whose bodies are the largest)."""
    endpoint.reads_its_body = True  # type: ignore[attr-defined]
    return endpoint


def is_json(request: Request) -> bool:
    return "json" in request.headers.get("content-type", "").lower()


async def read_json(request: Request) -> Any:
    """The request's JSON body, parsed once and kept where Starlette's `request.json()` (which
    FastAPI reads the body with) finds it; a large one off the event loop. None when empty or
    malformed: FastAPI reports malformed JSON itself."""
    if hasattr(request, "_json"):
        return request._json
    raw = await request.body()
    if not raw:
        return None
    try:
        if len(raw) > PARSE_INLINE_BYTES:
            body = await run_in_threadpool(json.loads, raw)
        else:
            body = json.loads(raw)
    except ValueError:
        return None
    except RecursionError:
        raise invalid([FieldError(path="$", message="JSON nested too deeply")]) from None
    request._json = body
    return body


async def refuse_unstorable_json(request: Request) -> None:
    endpoint = getattr(request.scope.get("route"), "endpoint", None)
    if getattr(endpoint, "reads_its_body", False) or not is_json(request):
        return
    body = await read_json(request)
    errors = unstorable_values(body)
    if not errors:
        return
    # Raised before FastAPI validates the body: its other faults are listed too, as always
    model = body_model(request)
    try:
        if model is not None:
            model.model_validate(body)
    except ValidationError as exc:
        named = {e.path for e in errors}
        others = field_errors(exc.errors(include_url=False), model)
        errors += [e for e in others if e.path not in named]
    raise invalid(errors)


StorableJson = Depends(refuse_unstorable_json)
