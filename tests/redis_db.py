"""Redis database numbers for tests, one set per pytest-xdist worker.

Tests that need a real Redis use a fixed database number each (flushed before use); two xdist
workers running the same module at once would share it, and one worker's Celery would take the
other's jobs. Worker gwN gets base + N * STRIDE, so the bases below must leave room.
"""

from __future__ import annotations

import os

STRIDE = 4  # bases 4..7, clear of database 0 (a default); gw0..gw2 reach base + 8 <= 15
E2E, API, RATE_LIMITS, ROTATION = 4, 5, 6, 7


def redis_db(base: int) -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return base + STRIDE * int(worker.removeprefix("gw") or 0)
