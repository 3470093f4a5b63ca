"""uvicorn's httptools protocol with the read deadlines and the header bound it lacks.

- **Header deadline** (`GRPO_HTTP_HEADER_TIMEOUT_S`): a request's line and headers must all
  arrive within this, counted from the connection's opening for its first request and from the
  first byte of each later one (between requests uvicorn's keep-alive timeout applies). Past it
  the client gets a 408 and the connection is closed: a client that connects and sends nothing,
  or a byte now and then, no longer holds a connection for ever.
- **Body pause** (`GRPO_HTTP_BODY_TIMEOUT_S`): while a request body is arriving, the longest
  wait for its next bytes; past it the connection is closed and the request sees a disconnect.
  Not counted while uvicorn itself has paused reading (the application is behind, not the
  client). A large upload on a slow but steady link is never cut off.
- **Header bytes** (`GRPO_HTTP_MAX_HEADER_BYTES`): the request line plus headers; beyond, 431.
- **Even shares**: an API process holding more than its share of the server's connections
  answers with `Connection: close`, so that the client's next connection may land on another
  (`service.connection_shares`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.connection_shares import ConnectionShares, current_shares
from service.settings import get_settings

log = logging.getLogger(__name__)


class HeadersTooLarge(Exception):
    """Raised from a parser callback to stop parsing; answered with 431."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self._header_timeout = settings.http_header_timeout_s
        self._body_timeout = settings.http_body_timeout_s
        self._max_header_bytes = settings.http_max_header_bytes
        self._header_bytes = 0
        self._headers_too_large = False
        self._deadline: asyncio.TimerHandle | None = None
        self._shares: ConnectionShares | None = None

    # Deadlines
    def _arm(self, seconds: float, on_expiry: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, on_expiry)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.info("closing a connection whose request headers took over %ss", self._header_timeout)
        idle = self.cycle is None or self.cycle.response_complete
        self._refuse(b"408 Request Timeout", "request headers not received in time", idle)

    def _body_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # we stopped reading, not the client: wait again
            self._arm(self._body_timeout, self._body_timed_out)
            return
        log.info("closing a connection whose request body paused over %ss", self._body_timeout)
        self.transport.close()  # the application's receive() now returns http.disconnect

    def _refuse(self, status: bytes, message: str, respond: bool = True) -> None:
        if respond:
            body = message.encode("ascii")
            head = [b"HTTP/1.1 " + status + b"\r\n"]
            for name, value in self.server_state.default_headers:
                head.append(name + b": " + value + b"\r\n")
            head.append(b"content-type: text/plain; charset=utf-8\r\n")
            head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
            self.transport.write(b"".join(head) + body)
        self.transport.close()

    # Connection and parser callbacks
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._header_timeout, self._headers_timed_out)
        self._shares = current_shares()  # an API process sharing its port with others
        if self._shares is not None:
            self._shares.opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._shares is not None:
            self._shares.closed()
            self._shares = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._deadline is None:  # the first request's deadline runs from the connection
            self._arm(self._header_timeout, self._headers_timed_out)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self._max_header_bytes:
            self._headers_too_large = True
            raise HeadersTooLarge

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        # A body may follow: from now on its pauses are timed (disarmed when it is complete).
        self._arm(self._body_timeout, self._body_timed_out)
        super().on_headers_complete()
        cycle = self.cycle  # this request's (none for an upgrade)
        if (
            self._shares
            and cycle
            and not cycle.response_complete
            and self._shares.should_close_one()
        ):
            cycle.keep_alive = False  # answered with `Connection: close`
            self._shares = None  # counted out already

    def on_body(self, body: bytes) -> None:
        self._arm(self._body_timeout, self._body_timed_out)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers any parser error with a 400; ours, headers over the bound, is a 431.
        if self._headers_too_large:
            limit = f"request line and headers over {self._max_header_bytes} bytes"
            self._refuse(b"431 Request Header Fields Too Large", limit)
            return
        super().send_400_response(msg)
