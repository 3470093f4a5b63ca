"""A real HTTP receiver for webhook deliveries: a `http.server` thread on 127.0.0.1 that keeps
every request it gets (headers, body, arrival time) and answers what its path asks for."""

from __future__ import annotations

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
