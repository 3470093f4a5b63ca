"""A small scripted HTTP server for the client behaviours the real service cannot be made to
show on demand: 429/503 with Retry-After, and a download endpoint that ignores Range."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Script:
    """`answers[path]`: a list of (status, headers, body) served in turn (the last repeats)."""

    answers: dict[str, list[tuple[int, dict[str, str], bytes]]]
    seen: list[dict[str, Any]] = field(default_factory=list)


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = self.path.split("?")[0]
            seen = {"method": self.command, "path": path, "headers": dict(self.headers)}
            script.seen.append({**seen, "body": body})
            queue = script.answers.get(path) or [(404, {}, b'{"status":404,"title":"Not Found"}')]
            status, headers, payload = queue.pop(0) if len(queue) > 1 else queue[0]
            self.send_response(status)
            for k, v in {"Content-Length": str(len(payload)), **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def scripted_server(script: Script) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def as_json(status: int, body: Any, **headers: str) -> tuple[int, dict[str, str], bytes]:
    ctype = "application/problem+json" if status >= 400 else "application/json"
    return status, {"Content-Type": ctype, **headers}, json.dumps(body).encode()
