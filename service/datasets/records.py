"""Validation of one dataset record: `{prompt: str | [{role, content}], ...fields}`."""

from __future__ import annotations

from typing import Any

from service.core.problems import FieldError

MAX_ERRORS = 50


def record_errors(record: Any, path: str) -> list[FieldError]:
    if not isinstance(record, dict):
        return [FieldError(path=path, message="a record must be a JSON object")]
    prompt = record.get("prompt")
    if prompt is None:
        return [FieldError(path=f"{path}.prompt", message="'prompt' is required")]
    if isinstance(prompt, str):
        return [] if prompt else [FieldError(path=f"{path}.prompt", message="empty prompt")]
    if not isinstance(prompt, list) or not prompt:
        return [
            FieldError(
                path=f"{path}.prompt",
                message="'prompt' must be a string or a non-empty list of {role, content}",
            )
        ]
    errors = []
    for i, message in enumerate(prompt):
        ok = (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        )
        if not ok:
            errors.append(
                FieldError(
                    path=f"{path}.prompt[{i}]", message="a message is {role: str, content: str}"
                )
            )
    return errors
