"""OpenAI's reinforcement fine-tuning lines and our dataset records, both ways.

A line is `{"messages": [{role, content}, ...], ...fields}`: the messages are the prompt the
model answers, every other field is the grader's `item` (`{{item.answer}}`). Stored as our
record `{"prompt": messages, ...fields}` (prompt first), so the file IS a dataset: jobs,
verifiers and the dashboard read it as any other. Its content is read back in OpenAI's shape by
renaming that first key again (`as_line`).
"""

from __future__ import annotations

import json
from typing import Any

from service.core.problems import FieldError

ROLES = ("system", "developer", "user", "assistant")
FORMAT = "OpenAI's reinforcement fine-tuning format: {messages: [...], ...fields the grader reads}"


def _message_errors(messages: Any, path: str) -> list[FieldError]:
    if not isinstance(messages, list) or not messages:
        return [FieldError(path=path, message="'messages' must be a non-empty list")]
    errors = []
    for i, message in enumerate(messages):
        ok = (
            isinstance(message, dict)
            and message.get("role") in ROLES
            and isinstance(message.get("content"), str)
        )
        if not ok:
            errors.append(
                FieldError(
                    path=f"{path}[{i}]",
                    message=f"a message is {{role: {' | '.join(ROLES)}, content: str}}",
                )
            )
    if not errors and messages[-1]["role"] == "assistant":
        errors.append(
            FieldError(
                path=f"{path}[{len(messages) - 1}]",
                message="the last message must not be the assistant's: the model writes it",
            )
        )
    return errors


def from_line(line: Any, path: str) -> tuple[Any, list[FieldError]]:
    """The record for one parsed line, or the line's errors (`path` is the line's)."""
    if not isinstance(line, dict):
        return None, [FieldError(path=path, message=f"a line is a JSON object ({FORMAT})")]
    if "messages" not in line:
        return None, [
            FieldError(path=f"{path}.messages", message=f"'messages' is required ({FORMAT})")
        ]
    if "prompt" in line:
        message = "'prompt' is reserved: the messages are the prompt; rename the field"
        return None, [FieldError(path=f"{path}.prompt", message=message)]
    errors = _message_errors(line["messages"], f"{path}.messages")
    if errors:
        return None, errors
    fields = {k: v for k, v in line.items() if k != "messages"}
    return {"prompt": line["messages"], **fields}, []


def as_line(record: dict[str, Any]) -> dict[str, Any]:
    """A stored record in OpenAI's shape: its prompt as `messages`."""
    prompt = record.get("prompt")
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return {"messages": messages, **{k: v for k, v in record.items() if k != "prompt"}}


def content(stored: bytes) -> bytes:
    """A file's JSONL in OpenAI's shape, from the dataset's canonical JSONL."""
    out = bytearray()
    for line in stored.splitlines():
        if line.strip():
            out += json.dumps(as_line(json.loads(line)), ensure_ascii=False).encode() + b"\n"
    return bytes(out)


# The canonical line of a file's record starts `{"prompt": ` and its OpenAI line
# `{"messages": ` (json.dumps keeps the key order, the rest is the same bytes): the content is
# exactly this much longer per record, so `bytes` is known without reading the object.
EXTRA_BYTES_PER_LINE = len('"messages"') - len('"prompt"')
