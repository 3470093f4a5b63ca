"""Real receivers for webhook deliveries on 127.0.0.1: `run_receiver`, a `http.server` thread
that keeps every request it gets (headers, body, arrival time) and answers what its path asks
for; `silent_receiver`, a TCP server that never answers and counts the connections left open."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() on arrival


@dataclass
class Receiver:
    base_url: str
    requests: list[Received] = field(default_factory=list)
    # path -> status codes to answer, in turn (then 200): "500 twice, then 200"
    script: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, path: str | None = None) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if path is None or r.path == path]

    def wait_for(self, predicate, timeout: float = 60.0) -> list[Received]:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(got := self.got()):
                return got
            time.sleep(0.05)
        raise AssertionError(f"the receiver did not get what was awaited: {self.got()}")


@contextmanager
def run_receiver() -> Iterator[Receiver]:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with receiver.lock:
                receiver.requests.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                             time.time())
                )  # fmt: skip
                queue = receiver.script.get(self.path, [])
                status = queue.pop(0) if queue else 200
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(base_url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Silent:
    """A TCP server that reads whatever comes and never answers; counts connections."""

    port: int = 0
    accepted: int = 0
    closed_by_client: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open_connections(self) -> int:
        with self.lock:
            return self.accepted - self.closed_by_client


@contextmanager
def silent_receiver() -> Iterator[Silent]:
    silent = Silent()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    writers: set[asyncio.StreamWriter] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with silent.lock:
            silent.accepted += 1
        writers.add(writer)
        try:
            while await reader.read(65536):  # b"": the client closed its end
                pass
            with silent.lock:
                silent.closed_by_client += 1
        finally:
            writers.discard(writer)
            writer.close()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)

    async def close(server: asyncio.Server) -> None:
        server.close()
        for writer in list(writers):  # the handlers' reads end
            writer.transport.abort()
        while writers:
            await asyncio.sleep(0.01)

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    silent.port = server.sockets[0].getsockname()[1]
    try:
        yield silent
    finally:
        asyncio.run_coroutine_threadsafe(close(server), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def closed_without_the_collector(slow: Silent, timeout: float) -> None:
    """Until no connection is left open, within `timeout` s, with the garbage collector off
    (so it cannot close one for us)."""
    gc.disable()
    try:
        start = time.monotonic()
        while (left := slow.open_connections()) != 0:
            assert time.monotonic() - start < timeout, f"{left} connections still open"
            time.sleep(0.05)
    finally:
        gc.enable()
