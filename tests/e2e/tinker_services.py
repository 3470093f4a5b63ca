"""A real API on a fresh PostgreSQL database beside a real `grpo-service tinker-worker`, for the
Tinker e2e tests that look into the database (tinker_requests) or need PostgreSQL's json."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.api.server import run_api
from tests.e2e.conftest import PG, _psql
from tests.e2e.services import RunningService, stop_all
from tests.e2e.test_tinker_sdk import start_worker


@contextmanager
def tinker_service(work: Path, model: Path, settings: dict[str, str]) -> Iterator[RunningService]:
    """`settings` (GRPO_*) over a 1 s long-poll and a 50 ms idle worker poll. procs: the API,
    the tinker worker, then whatever the test adds (all stopped at the end)."""
    db = f"grpo_tinker_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {db}")
    env = {
        "GRPO_DATABASE_URL": f"{PG}/{db}",
        "GRPO_TINKER_LONG_POLL_S": "1",
        "GRPO_TINKER_WORKER_POLL_S": "0.05",
        **settings,
    }
    try:
        with run_api(env, work, model) as api:
            api.procs.append(start_worker(api))
            try:
                yield api
            finally:
                stop_all(api.procs[1:], timeout=20)
    finally:
        _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
