"""The API server's limits on slow and oversized clients, as uvicorn command-line options.

uvicorn has no read deadline of its own: a connection that sends nothing, or a header line now
and then, is held for ever (3,050 such connections were still held after 100 s). The protocol
named here (`service/http_protocol.py`) adds the deadlines; the rest is what uvicorn offers.
None of it makes a public API safe against a slowloris from many addresses: put a reverse
proxy that buffers requests in front (docs/architecture.md#deployment-in-detail).
"""

from __future__ import annotations

from service.settings import Settings, get_settings

PROTOCOL = "service.http_protocol:BoundedHttpToolsProtocol"


def uvicorn_options(settings: Settings | None = None) -> list[str]:
    settings = settings or get_settings()
    return [
        "--http", PROTOCOL,
        "--timeout-keep-alive", str(settings.http_keepalive_s),
        "--limit-concurrency", str(settings.http_limit_concurrency),
        "--backlog", str(settings.http_backlog),
        # Only h11 reads it (the protocol above bounds headers itself); set for a fallback.
        "--h11-max-incomplete-event-size", str(settings.http_max_header_bytes),
    ]  # fmt: skip
