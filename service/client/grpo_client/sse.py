"""A Server-Sent Events reader (the WHATWG `text/event-stream` format) over httpx lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class SseEvent:
    event: str
    data: str
    id: str | None


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """Dispatch one SseEvent per blank-line-terminated block; comments and `retry:` skipped."""
    event, data, last_id = "", [], None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield SseEvent(event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            last_id = value
