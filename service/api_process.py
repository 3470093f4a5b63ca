"""One API server process: `python -m service.api_process APP --host H --port P [--shared]`.

`grpo-service api --workers N` runs N of these under the supervisor rather than uvicorn's own
`--workers`. uvicorn's workers accept from one listening socket, and whichever is on a CPU
when a connection arrives takes it: on a busy machine clients that connect together land
mostly on one worker (22 of 32 in `bench/api_load.py` on 2 cores), and that worker's clients
wait the longest. Here each process binds a socket of its own with `SO_REUSEPORT` (`--shared`),
and the kernel spreads new connections over the sockets by a hash of the client's address,
whether or not their processes are busy; `service.connection_shares` evens out what the hash
leaves uneven. Only processes of the same user may join such a port, and the supervisor
checks that nothing listens on it before it starts them (`claim_port`), so a second server
started by mistake fails instead of silently taking a share of the clients.
"""

from __future__ import annotations

import argparse
import socket
import sys

import uvicorn

from service.connection_shares import start_sharing, stop_sharing
from service.http.http_limits import server_options


def listening_socket(host: str, port: int, shared: bool) -> socket.socket:
    """A bound TCP socket for `host:port`; `shared`: one of several (`SO_REUSEPORT`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock


def claim_port(host: str, port: int) -> None:
    """Refuse to start on a port something already listens on: processes sharing a port
    would join that listener's group instead of failing (when it is the same user's)."""
    listening_socket(host, port, shared=False).close()


def serve(app: str, host: str, port: int, shared: bool, factory: bool = False) -> None:
    sock = listening_socket(host, port, shared)
    if shared:  # counted from the start, with no connection yet: the others send it its share
        start_sharing(port)
    config = uvicorn.Config(
        app, host=host, port=port, factory=factory, access_log=False, **server_options()
    )
    SharingServer(config).run(sockets=[sock])


class SharingServer(uvicorn.Server):
    """Removes its connection count at shutdown: uvicorn ends the process by raising the
    signal that stopped it again, so no `atexit` handler would run."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        stop_sharing()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service.api_process")
    parser.add_argument("app", help="ASGI application, module:attribute")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--shared", action="store_true", help="one of several on this port")
    parser.add_argument("--factory", action="store_true", help="`app` is a factory")
    args = parser.parse_args(argv)
    serve(args.app, args.host, args.port, args.shared, args.factory)


if __name__ == "__main__":
    main(sys.argv[1:])
