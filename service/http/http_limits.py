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


def server_options(settings: Settings | None = None) -> dict[str, str | int]:
    """The options as `uvicorn.Config` takes them (`service/api_process.py`)."""
    settings = settings or get_settings()
    return {
        "http": PROTOCOL,
        "timeout_keep_alive": settings.http_keepalive_s,
        "limit_concurrency": settings.http_limit_concurrency,
        "backlog": settings.http_backlog,
        # Only h11 reads it (the protocol above bounds headers itself); set for a fallback.
        "h11_max_incomplete_event_size": settings.http_max_header_bytes,
    }


def uvicorn_options(settings: Settings | None = None) -> list[str]:
    """The same options on uvicorn's command line."""
    return [
        part
        for name, value in server_options(settings).items()
        for part in (f"--{name.replace('_', '-')}", str(value))
    ]
