"""A database out of reach answers 503 with Retry-After, never a 500: status polls, submissions
and other reads alike, and the same requests answer again once the database is back. Real
PostgreSQL: the test's database is closed to new connections and its backends terminated, as a
restart or a failover does."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import tenant_client
from tests.api.helpers import job_body, make_dataset, make_job, make_verifier
from tests.api.server import run_api
from tests.e2e.conftest import PG, _psql
from tests.e2e.services import RunningService
from tests.redis_db import API, PrivateRedis


@pytest.fixture
def api_on_its_own_database(
    tmp_path: Path, tiny_model_dir: Path, redis_server: PrivateRedis
) -> Iterator[tuple[RunningService, str]]:
    db = f"grpo_outage_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {db}")
    env = {
        "GRPO_DATABASE_URL": f"{PG}/{db}",
        "GRPO_BROKER_URL": redis_server.url(API),
    }
    try:
        with run_api(env, tmp_path, tiny_model_dir) as svc:
            yield svc, db
    finally:
        _psql(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
        _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def _close(db: str) -> None:
    _psql(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false")
    _psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")


def test_an_unreachable_database_answers_503_then_recovers(
    api_on_its_own_database: tuple[RunningService, str],
) -> None:
    svc, db = api_on_its_own_database
    client = tenant_client(svc)
    make_verifier(client)
    dataset = make_dataset(client)
    job = make_job(client, dataset)
    poll = f"/v1/jobs/{job['id']}"
    assert client.get(poll).status_code == 200  # the key is cached: no lookup needed

    _close(db)
    deadline = time.monotonic() + 5  # a backend still ending may answer a poll or two
    while (answer := client.get(poll)).status_code == 200:
        assert time.monotonic() < deadline, "polls kept answering from a closed database"
        time.sleep(0.2)
    requests = {
        "poll": answer,
        "poll with a query string": client.get(poll, params={"fields": "all"}),
        "list": client.get("/v1/jobs"),
        "submission": client.post("/v1/jobs", json=job_body(dataset)),
    }
    for what, r in requests.items():
        assert r.status_code == 503, (what, r.status_code, r.text)
        assert r.headers["retry-after"] == "2", what
        assert r.json()["detail"] == "the database is unreachable: retry shortly", what

    _psql(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
    deadline = time.monotonic() + 15
    while client.get(poll).status_code != 200:
        assert time.monotonic() < deadline, svc.logs()
        time.sleep(0.2)
    assert client.post("/v1/jobs", json=job_body(dataset)).status_code == 201
    assert len(client.get("/v1/jobs").json()["data"]) == 2  # the refused submission stored nothing
