"""A Redis server of each test process's own, for the tests that need a real Redis.

Under pytest-xdist, two test processes running the same module at once on one Redis would share
its databases, and one process's Celery would take the other's jobs. The shared server on 6379
has 16 databases, which at four uses a process ran out at the fourth test process (TEST_WORKERS
4: "DB index is out of range"). A server per test process, started on first use, keeps them
apart for any number of processes; each use below keeps its own database on it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass

import redis

E2E, API, RATE_LIMITS, ROTATION = 1, 2, 3, 4


@dataclass
class PrivateRedis:
    """`redis-server` on `port`, keeping nothing on disk."""

    port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client(0).ping()
                return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "private redis did not start"
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db)

    def fresh(self, db: int) -> str:
        """Database `db` emptied; its URL."""
        self.client(db).flushdb()
        return self.url(db)
