"""The API server's limits on slow and oversized clients: uvicorn's own settings, no more.

uvicorn's h11 protocol (chosen here over httptools, which bounds no header size) caps the
request line plus headers (`h11_max_incomplete_event_size`: beyond, 400 and close); idle
keep-alive connections close after `timeout_keep_alive`; past `limit_concurrency` connections
plus running requests a process answers 503; `backlog` bounds the kernel's accept queue.
uvicorn has no deadline for a request's headers or body: a client that connects and then sends
nothing, or a byte now and then, holds its connection until it leaves. A public API therefore
sits behind a reverse proxy that buffers whole requests before passing them on (nginx,
Envoy, a cloud load balancer): docs/architecture.md#deployment-in-detail.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from service.settings import Settings, get_settings


class ServerOptions(TypedDict):
    http: Literal["h11"]
    h11_max_incomplete_event_size: int
    timeout_keep_alive: int
    limit_concurrency: int
    backlog: int


def server_options(settings: Settings | None = None) -> ServerOptions:
    """The options as `uvicorn.run` and `uvicorn.Config` take them."""
    settings = settings or get_settings()
    return {
        "http": "h11",
        "h11_max_incomplete_event_size": settings.http_max_header_bytes,
        "timeout_keep_alive": settings.http_keepalive_s,
        "limit_concurrency": settings.http_limit_concurrency,
        "backlog": settings.http_backlog,
    }


def uvicorn_options(settings: Settings | None = None) -> list[str]:
    """The same options on uvicorn's command line."""
    return [
        part
        for name, value in server_options(settings).items()
        for part in (f"--{name.replace('_', '-')}", str(value))
    ]
