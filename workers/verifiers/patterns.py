"""Tenant regular expressions run on RE2 (google-re2): time linear in the text, whatever the
pattern, so no pattern can stall the API or a worker (`^(a+)+$` on "a" * 34 + "b" takes seconds
to hours with Python's backtracking `re`, microseconds here).

RE2 has no backreferences and no lookaround; a pattern that needs them is refused when the
verifier is registered, with RE2's reason. Used by the `regex` kind and by a `json_schema`
kind's `pattern` / `patternProperties` keywords.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

import re2

# The flags a `regex` verifier may set, as RE2's inline flags.
FLAGS = {"IGNORECASE": "i", "MULTILINE": "m", "DOTALL": "s"}
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the error goes back to the tenant, not to the server's stderr
_OPTIONS.max_mem = 8 << 20  # bytes of compiled program; a larger pattern is refused


class PatternError(ValueError):
    """The pattern is not one RE2 runs; the message says why."""


def compile_pattern(pattern: str, flags: Iterable[str] = ()) -> Any:
    """A compiled RE2 pattern (`search`, `fullmatch`, `groups`, `groupindex`, like `re`)."""
    return _compile(pattern, "".join(sorted(FLAGS[f] for f in flags)))


@functools.lru_cache(maxsize=512)  # a schema's keywords compile their pattern at every check
def _compile(pattern: str, inline: str) -> Any:
    try:
        return re2.compile(f"(?{inline}){pattern}" if inline else pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args else "invalid pattern"
        if _python_accepts(pattern):
            raise PatternError(
                f"not supported by the linear-time regex engine (RE2): {reason}"
                " (backreferences and lookaround are not available)"
            ) from None
        raise PatternError(f"invalid pattern: {reason}") from None
    except (TypeError, ValueError) as exc:
        raise PatternError(f"invalid pattern: {exc}") from None


def schema_patterns(schema: Any, path: tuple[str | int, ...] = ()) -> Iterable[tuple[tuple, str]]:
    """Every regex a JSON Schema holds: (path, pattern) for `pattern` values and
    `patternProperties` keys, at any depth."""
    if isinstance(schema, dict):
        if isinstance(schema.get("pattern"), str):
            yield (*path, "pattern"), schema["pattern"]
        if isinstance(schema.get("patternProperties"), dict):
            for key in schema["patternProperties"]:
                yield (*path, "patternProperties", key), key
        for key, value in schema.items():
            yield from schema_patterns(value, (*path, key))
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from schema_patterns(value, (*path, i))


def schema_depth(schema: Any) -> int:
    """How deeply the schema's objects and arrays nest (iteratively: no recursion limit)."""
    deepest, stack = 0, [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _python_accepts(pattern: str) -> bool:
    """Whether Python's `re` compiles it (compiling is safe; matching is what backtracks)."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, MemoryError):
        return False
    return True
