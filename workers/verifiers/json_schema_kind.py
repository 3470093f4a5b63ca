"""The `json_schema` kind: is the completion JSON that fits a schema (and the reference)?

Runs in the built-in kinds' helper process (`builtin_host.py`), whose per-batch deadline also
bounds what the schema's combinators can cost (`anyOf` over a nested instance grows
exponentially with its depth). Remote `$ref`s are never fetched (the `referencing` registry that
jsonschema uses retrieves nothing by default), and the completion is parsed by the standard
library with a size cap, so a hostile completion costs at most one bounded parse.
The schema's regexes (`pattern`, `patternProperties`, and so `additionalProperties` beside
them) run on RE2 (`patterns.py`), in time linear in the completion.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from jsonschema import ValidationError, validators

from .base import Sample
from .builtin import _field
from .config import JsonSchemaConfig
from .patterns import compile_pattern

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


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not compile_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = compile_pattern(pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    regexes = [compile_pattern(p) for p in schema.get("patternProperties", {})]
    extras = [k for k in instance if k not in named and not any(r.search(k) for r in regexes)]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        yield ValidationError(f"Additional properties are not allowed ({extras!r} unexpected)")


_RE2_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


def json_schema(cfg: JsonSchemaConfig) -> Callable[[Sample], float]:
    base = validators.validator_for(cfg.json_schema)
    validator = validators.extend(base, _RE2_KEYWORDS)(cfg.json_schema)

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
