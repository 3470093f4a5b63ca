"""Values the stores can keep: text that is valid Unicode without NUL characters, and numbers
that are finite.

A JSON string may hold a lone surrogate (`"\\ud800"`), which cannot be encoded as UTF-8, and
NUL characters, which PostgreSQL's text and JSONB refuse. Python's JSON reader also takes
`NaN` and `Infinity` (and reads `1e999` as infinite), which are not JSON: PostgreSQL's json
refuses them and no other reader reads them back. Each reached the database or a hash and
failed there as a 500; all are refused at the edge instead, naming where they are.
"""

from __future__ import annotations

import math
from typing import Any

from service.core.problems import FieldError

NOT_FINITE = "a number must be finite (NaN and Infinity are not JSON)"


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored, or None."""
    if "\x00" in value:
        return "text must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode (it holds a lone surrogate)"
    return None


def unstorable_values(value: Any, path: str = "$", limit: int = 50) -> list[FieldError]:
    """The strings, object keys and numbers of a parsed JSON value that cannot be stored, in
    the order they are written, `limit` at most."""
    found: list[FieldError] = []
    stack = [(value, path)]
    while stack and len(found) < limit:
        item, where = stack.pop()
        if isinstance(item, str):
            if message := text_problem(item):
                found.append(FieldError(path=where, message=message))
        elif isinstance(item, float):
            if not math.isfinite(item):
                found.append(FieldError(path=where, message=NOT_FINITE))
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                if isinstance(key, str) and (message := text_problem(key)):
                    found.append(FieldError(path=where, message=f"a key: {message}"))
                    continue
                children.append((child, f"{where}.{key}"))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend((item[i], f"{where}[{i}]") for i in range(len(item) - 1, -1, -1))
    return found[:limit]


def unstorable_value(value: Any, path: str = "$") -> FieldError | None:
    """The first string, object key or number in a parsed JSON value that cannot be stored."""
    found = unstorable_values(value, path, limit=1)
    return found[0] if found else None
