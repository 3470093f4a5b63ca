"""Pydantic's validation errors as our field errors, worded for a person.

Two rewrites of pydantic's own messages: a validator's `ValueError` loses pydantic's "Value
error, " prefix (the message is the validator's sentence), and an unknown field
(`extra_forbidden`, "Extra inputs are not permitted") names the object it belongs in when a
nested object of the model takes a field of that name (a top-level `learning_rate`: `grpo`),
or else the closest field of the model it sits in, found by walking the error's location
through the model's fields and matching with difflib's `get_close_matches`
(Ratcliff/Obershelp similarity, cut-off 0.6).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from difflib import get_close_matches
from typing import Any, get_args

from pydantic import BaseModel

from service.core.problems import FieldError, json_path

VALUE_ERROR_PREFIX = "Value error, "
# Where a location starts in a request (FastAPI's first element), not a field of the model.
_REQUEST_PARTS = ("body", "query", "path", "header")


def field_errors(
    errors: Iterable[Mapping[str, Any]], model: type[BaseModel] | None = None
) -> list[FieldError]:
    """One `FieldError` per pydantic error; `model` is what was validated (for suggestions)."""
    return [
        FieldError(path=json_path(tuple(e.get("loc", ()))), message=field_message(e, model))
        for e in errors
    ]


def field_message(error: Mapping[str, Any], model: type[BaseModel] | None = None) -> str:
    message = str(error.get("msg", "invalid")).removeprefix(VALUE_ERROR_PREFIX)
    if error.get("type") != "extra_forbidden":
        return message
    loc = [p for p in error.get("loc", ()) if p not in _REQUEST_PARTS]
    if not loc:
        return message
    owner = _model_at(model, loc[:-1])
    if owner is None:
        return "unknown field"
    names = _field_names(owner)
    home = _nested_home(owner, str(loc[-1]))
    if home is not None:
        return f"unknown field here: it belongs in `{home}` (`{home}.{loc[-1]}`)"
    close = get_close_matches(str(loc[-1]), names, n=1)
    if close:
        return f"unknown field: did you mean `{close[0]}`?"
    return "unknown field; this object takes " + ", ".join(f"`{n}`" for n in names)


def _field_names(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _nested_home(model: type[BaseModel], name: str) -> str | None:
    """The field of `model` whose object takes `name`, when one does: a top-level
    `learning_rate` (as OpenAI's and TRL's flat configs have it) belongs in `grpo`."""
    for field_name, field in model.model_fields.items():
        inner = _model_in(field.annotation)
        if inner is not None and name in _field_names(inner):
            return field.alias or field_name
    return None


def _model_at(model: type[BaseModel] | None, path: Sequence[Any]) -> type[BaseModel] | None:
    """The model whose object sits at `path` inside `model` (list indices step into items)."""
    current = model
    for part in path:
        if current is None:
            return None
        if isinstance(part, int):
            continue  # an item of a list field: `current` is already the item's model
        by_name = {field.alias or name: field for name, field in current.model_fields.items()}
        field = by_name.get(part)
        current = _model_in(field.annotation) if field is not None else None
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside an annotation (`Spec`, `Spec | None`, `list[Spec]`), if one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
