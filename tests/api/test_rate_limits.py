"""The request rate per API key (issue 21 item 5): a token bucket of GRPO_RATE_LIMIT_BURST
requests refilled at GRPO_RATE_LIMIT_PER_MINUTE; beyond it 429 problem+json with Retry-After,
and RateLimit-* headers on every limited answer. In embedded mode each API process keeps its
own buckets; with a Redis broker two API processes draw from one bucket, so the limit holds
across them. Unauthenticated routes (probes, metrics, docs) are never limited."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.auth.ratelimit import redis_url_for
from service.settings import Settings
from tests.api.helpers import problem
from tests.api.server import METRICS_TOKEN, run_api
from tests.e2e.conftest import PG, _psql
from tests.e2e.services import RunningService
from tests.redis_db import RATE_LIMITS, PrivateRedis


def _limits(per_minute: int, burst: int) -> dict[str, str]:
    return {"GRPO_RATE_LIMIT_PER_MINUTE": str(per_minute), "GRPO_RATE_LIMIT_BURST": str(burst)}


def test_in_process_bucket(tmp_path: Path) -> None:
    with run_api(_limits(60, 3), tmp_path) as svc:  # embedded: SQLite, no Redis
        key = svc.new_key("limited")
        client = svc.client(key)
        answers = [client.get("/v1/me") for _ in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 200]
        assert [r.headers["ratelimit-remaining"] for r in answers] == ["2", "1", "0"]
        assert {r.headers["ratelimit-limit"] for r in answers} == {"60"}
        assert all(1 <= int(r.headers["ratelimit-reset"]) <= 3 for r in answers)
        # A handler that builds its Response by hand (the status poll) carries them too.
        over = client.get("/v1/jobs/job_missing")
        body = problem(over, 429)
        assert "rate limit of 60 requests a minute" in body["detail"]
        assert over.headers["retry-after"] == "1"
        assert over.headers["ratelimit-remaining"] == "0"
        assert over.headers["ratelimit-limit"] == "60"
        # Per key: another key of the same tenant has a bucket of its own.
        assert svc.client(svc.new_key("limited")).get("/v1/me").status_code == 200
        # Unauthenticated routes are not limited and carry no RateLimit headers.
        operator = {"Authorization": f"Bearer {METRICS_TOKEN}"}
        for path in ("/healthz", "/readyz", "/openapi.json", "/metrics"):
            r = httpx.get(svc.base_url + path, headers=operator if path == "/metrics" else {})
            assert r.status_code == 200 and "ratelimit-limit" not in r.headers, path
        time.sleep(int(over.headers["retry-after"]) + 0.1)
        assert client.get("/v1/me").status_code == 200  # a token came back


@pytest.fixture
def two_apis(
    tmp_path: Path, redis_server: PrivateRedis
) -> Iterator[tuple[RunningService, RunningService]]:
    """Two API processes on one PostgreSQL database and one Redis: 10 requests at once, then
    one every 10 s."""
    db = f"grpo_rl_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {db}")
    env = {
        "GRPO_DATABASE_URL": f"{PG}/{db}",
        "GRPO_BROKER_URL": redis_server.fresh(RATE_LIMITS),
        "GRPO_STORAGE_URL": f"file://{tmp_path / 'objects'}",
        **_limits(6, 10),
    }
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        with (
            run_api(env, tmp_path / "a") as a,
            run_api(env, tmp_path / "b") as b,
        ):
            yield a, b
    finally:
        _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        redis_server.client(RATE_LIMITS).flushdb()


def test_one_bucket_across_api_processes(
    two_apis: tuple[RunningService, RunningService], redis_server: PrivateRedis
) -> None:
    a, b = two_apis
    key = a.new_key("shared")
    clients = [a.client(key), b.client(key)]
    started = time.monotonic()
    answers = [clients[i % 2].get("/v1/me") for i in range(20)]  # alternating processes
    elapsed = time.monotonic() - started
    codes = [r.status_code for r in answers]
    print(f"20 requests alternating over 2 API processes in {elapsed:.2f} s: {codes}")
    assert elapsed < 9  # less than one token's refill: the burst is all there is
    # Each process alone would have let 10 through; together they let 10 through.
    assert codes == [200] * 10 + [429] * 10
    remaining = [int(r.headers["ratelimit-remaining"]) for r in answers[:10]]
    assert remaining == list(range(9, -1, -1))  # one count, whichever process answered
    for r in answers[10:]:
        problem(r, 429)
        assert 1 <= int(r.headers["retry-after"]) <= 10
        assert r.headers["ratelimit-limit"] == "6"
    # The bucket is Redis's, and expires once it would be full again anyway.
    bucket = f"grpo:ratelimit:{_key_id(a, key)}"
    assert 0 < redis_server.client(RATE_LIMITS).pttl(bucket) <= 101_000


def _key_id(svc: RunningService, key: str) -> str:
    line = next(x for x in svc.cli("keys", "list").splitlines() if x.split()[1] == key[:12])
    return line.split()[0]


def test_the_bucket_store() -> None:
    """GRPO_REDIS_URL first, else a Redis broker, else in-process (embedded mode)."""
    redis_broker = "redis://broker:6379/0"
    assert redis_url_for(Settings(broker_url=redis_broker)) == redis_broker
    assert redis_url_for(Settings(broker_url="rediss://b/1")) == "rediss://b/1"
    assert (
        redis_url_for(Settings(broker_url=redis_broker, redis_url="redis://r/2")) == "redis://r/2"
    )
    assert redis_url_for(Settings(broker_url="amqp://rabbit//")) is None
    assert redis_url_for(Settings()) is None
