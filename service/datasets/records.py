"""Validation of one dataset record: `{prompt: str | [{role, content}], ...fields}`, and the
common chat shape `{messages: [{role, content}, ...], ...fields}` (OpenAI's and TRL's) turned
into it (`from_messages`)."""

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


def _is_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def from_messages(record: Any, path: str) -> tuple[Any, list[FieldError]]:
    """A `{messages, ...}` record (no `prompt`) as the record stored: its prompt the messages up
    to the last user turn, the turns after it (a reference answer) its `reference` field (not
    `completion`: a verifier's argument of that name is the model's), its other fields kept.
    Any other record is returned as it is."""
    if not isinstance(record, dict) or "prompt" in record or "messages" not in record:
        return record, []
    messages, where = record["messages"], f"{path}.messages"
    if not isinstance(messages, list) or not messages or not all(map(_is_message, messages)):
        message = "'messages' must be a non-empty list of {role: str, content: str}"
        return None, [FieldError(path=where, message=message)]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        message = "'messages' has no user turn (the prompt is the messages up to the last one)"
        return None, [FieldError(path=where, message=message)]
    last = users[-1]
    stored = {
        "prompt": messages[: last + 1],
        **{k: v for k, v in record.items() if k != "messages"},
    }
    if after := messages[last + 1 :]:
        if "reference" in record:
            message = "'reference' is taken by the turns after the last user turn; rename it"
            return None, [FieldError(path=f"{path}.reference", message=message)]
        stored["reference"] = after
    return stored, []
