"""Text the stores can keep: valid Unicode without NUL characters.

A JSON string may hold a lone surrogate (`"\\ud800"`), which cannot be encoded as UTF-8, and
NUL characters, which PostgreSQL's text and JSONB refuse. Either reached the database or a hash
and failed there as a 500; both are refused at the edge instead, naming where they are.
"""

from __future__ import annotations

from typing import Any

from service.core.problems import FieldError


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored, or None."""
    if "\x00" in value:
        return "text must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode (it holds a lone surrogate)"
    return None


def unstorable_text(value: Any, path: str = "$") -> FieldError | None:
    """The first string (or object key) in a parsed JSON value that cannot be stored."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if message := text_problem(item):
                return FieldError(path=where, message=message)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and (message := text_problem(key)):
                    return FieldError(path=where, message=f"a key: {message}")
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None
