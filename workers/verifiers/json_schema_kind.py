"""The `json_schema` kind: is the completion JSON that fits a schema (and the reference)?

Runs in the worker process. Remote `$ref`s are never fetched (the `referencing` registry that
jsonschema uses retrieves nothing by default), and the completion is parsed by the standard
library with a size cap, so a hostile completion costs at most one bounded parse.
Known limit: a schema's `pattern` runs Python's backtracking `re` on the completion; the schema
comes from the tenant who owns the job, so a catastrophic pattern only slows their own job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from jsonschema import validators

from .base import Sample
from .builtin import _field
from .config import JsonSchemaConfig

MAX_COMPLETION_CHARS = 1 << 20
_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)```", re.DOTALL)
_NO_JSON = object()


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NO_JSON


def _canonical(value: Any) -> str:
    """Compare JSON values as JSON: `true` is not `1`, key order does not matter."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def extract_json(completion: str, how: str) -> Any:
    """The JSON value in `completion` ('whole' text, last ```json 'fence', or 'auto': whole,
    then fence); `_NO_JSON` when there is none."""
    if how in ("auto", "whole"):
        value = _parse(completion.strip())
        if value is not _NO_JSON or how == "whole":
            return value
    fences = _FENCE.findall(completion)
    return _parse(fences[-1].strip()) if fences else _NO_JSON


def json_schema(cfg: JsonSchemaConfig) -> Callable[[Sample], float]:
    validator_cls = validators.validator_for(cfg.json_schema)
    validator = validator_cls(cfg.json_schema)

    def fn(sample: Sample) -> float:
        completion = sample.get("completion")
        if not isinstance(completion, str):
            raise TypeError(f"completion must be a string, not {type(completion).__name__}")
        if len(completion) > MAX_COMPLETION_CHARS:
            return 0.0
        value = extract_json(completion, cfg.extract)
        if value is _NO_JSON or not validator.is_valid(value):
            return 0.0
        if cfg.field is not None:
            expected = _field(sample, cfg.field)
            if isinstance(expected, str):  # a reference stored as JSON text
                parsed = _parse(expected)
                expected = expected if parsed is _NO_JSON else parsed
            return 1.0 if _canonical(value) == _canonical(expected) else 0.0
        return 1.0

    return fn
