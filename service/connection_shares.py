"""Keep-alive connections shared evenly between the API's processes.

The kernel spreads new connections over the processes' sockets by a hash of the client's
address (`service/api_process.py`), and a hash leaves 32 connections on two processes at 20
and 12, or further apart, about one time in five (binomially); the clients of the process
holding more wait longer for each answer (the p99 of `bench/api_load.py` follows the busier
process's share).
So each process publishes how many connections it holds, and one holding more than an even
share answers a request with `Connection: close`: the client reconnects (every HTTP/1.1
client does) from a new port, which hashes anew. HAProxy and gRPC's max connection age
rebalance the same way.

The counts live in one small file per process, in a directory named after the user and the
listening port (`/dev/shm` where there is one): the processes of one server find each other
there. Only processes started to share a port count (`start_sharing`): a server on a port
of its own never closes a connection for balance. A file whose process has died is not
counted; a process's file goes at its server's shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

# A process moves at most one connection per this long: a moved connection takes a round trip
# to land again, and the counts are read again before the next one is moved.
CHECK_EVERY_S = 0.05
_COUNT = struct.Struct("<q")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ConnectionShares:
    """This process's count of open connections, published for its siblings, and the test of
    whether it holds more than an even share of all of them."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = directory
        self.pid = os.getpid()
        self._path = directory / str(self.pid)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.held = 0
        self._checked_at = float("-inf")
        self._publish()

    def opened(self) -> None:
        self.held += 1
        self._publish()

    def closed(self) -> None:
        self.held = max(0, self.held - 1)
        self._publish()

    def should_close_one(self) -> bool:
        """Whether to end one connection after its answer: this process holds more than its
        even share (rounded up) of all the processes' connections. Decided at most once per
        `CHECK_EVERY_S`, on counts read then. The connection it says yes for is counted out at
        once (the caller does not report its close): its answer may take a while yet, and
        counted until then it would send others after it, more than the excess."""
        now = time.monotonic()
        if now - self._checked_at < CHECK_EVERY_S:
            return False
        self._checked_at = now
        others = self._read_others()
        if not others:
            return False
        total = self.held + sum(others)
        if self.held <= -(-total // (len(others) + 1)):
            return False
        self.closed()
        return True

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            self._path.unlink()
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # the last process out

    def _publish(self) -> None:
        if self._fd >= 0:  # closed: the server has shut down
            os.pwrite(self._fd, _COUNT.pack(self.held), 0)

    def _read_others(self) -> list[int]:
        counts = []
        try:
            paths = list(self.directory.iterdir())
        except OSError:  # removed under it (by hand): no siblings to be seen
            return counts
        for path in paths:
            if not path.name.isdigit() or int(path.name) == self.pid:
                continue
            if not _alive(int(path.name)):
                with contextlib.suppress(OSError):
                    path.unlink()  # a process that died without cleaning up
                continue
            with contextlib.suppress(OSError, struct.error):
                counts.append(_COUNT.unpack(path.read_bytes()[: _COUNT.size])[0])
        return counts


_shares: ConnectionShares | None = None


def start_sharing(port: int) -> None:
    """Count this process's connections among those of the others serving `port` (an API
    process started with `--shared`); no balancing where no directory for the counts can be
    made. A server on a port of its own never calls it, so never closes for balance."""
    global _shares
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    try:
        _shares = ConnectionShares(root / f"grpo-connections-{os.getuid()}-{port}")
    except OSError as exc:
        log.warning("connections are not balanced between processes: %s", exc)


def stop_sharing() -> None:
    """At the server's shutdown: its count file goes (and the directory, with the last)."""
    global _shares
    if _shares is not None:
        _shares.close()
        _shares = None


def current_shares() -> ConnectionShares | None:
    return _shares
