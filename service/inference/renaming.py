"""The backend's answers with `model` set to the name the caller used, as OpenAI echoes it: the
backend knows a fine-tuned model (`ft:…`) by its checkpoint id, and vLLM an adapter by the
name it was loaded under."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator


def renamed_body(content: bytes, model: str | None) -> bytes:
    """A completion object's JSON with `model` set (unchanged when `model` is None or the body
    is not a JSON object)."""
    if model is None:
        return content
    try:
        data = json.loads(content)
    except ValueError:
        return content
    if not isinstance(data, dict) or "model" not in data:
        return content
    data["model"] = model
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def _renamed_line(line: bytes, model: str) -> bytes:
    if not line.startswith(b"data:"):
        return line
    value = line[5:].removeprefix(b" ")
    if not value.startswith(b"{"):
        return line  # `[DONE]`
    renamed = renamed_body(value, model)
    return line if renamed is value else b"data: " + renamed


async def renamed_events(parts: AsyncIterator[bytes], model: str) -> AsyncIterator[bytes]:
    """Server-sent events as they arrive (in any pieces), each `data:` object's `model` set;
    whole lines only are passed on."""
    pending = b""
    async for part in parts:
        pending += part
        *lines, pending = pending.split(b"\n")
        if lines:
            yield b"".join(_renamed_line(line, model) + b"\n" for line in lines)
    if pending:
        yield _renamed_line(pending, model)
