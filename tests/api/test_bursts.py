"""Bursts against one API process on SQLite (the embedded mode's database): requests queue or
get a 503 with Retry-After, never a 500; open event streams hold no database connection
between polls, so they do not starve other requests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import served_over_http, tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.api.server import run_api
from tests.e2e.services import RunningService

api = served_over_http()  # bursts of connections


# One connection and a one-millisecond wait for it: overlapping requests exhaust the pool.
TINY_POOL = {
    "GRPO_DB_POOL_SIZE": "1",
    "GRPO_DB_MAX_OVERFLOW": "0",
    "GRPO_DB_POOL_TIMEOUT_S": "0.001",
}


@pytest.fixture(scope="module")
def tiny_pool_api(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RunningService]:
    with run_api(TINY_POOL, tmp_path_factory.mktemp("api-pool"), tiny_model_dir) as svc:
        yield svc


def _burst(svc: RunningService, key: str, n: int) -> list[tuple[int, str | None, float]]:
    def read(_: int) -> tuple[int, str | None, float]:
        started = time.monotonic()
        with httpx.Client(base_url=svc.base_url, headers={"Authorization": key}, timeout=90) as c:
            r = c.get("/v1/jobs?limit=100")
        return r.status_code, r.headers.get("retry-after"), time.monotonic() - started

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(read, range(n)))


def test_sixty_concurrent_reads_are_served_or_told_to_retry(api: RunningService) -> None:
    with tenant_client(api) as client:
        make_verifier(client)
        make_job(client, make_dataset(client))
        key = client.headers["Authorization"]
    results = _burst(api, key, 60)
    codes = [code for code, _, _ in results]
    slowest = max(t for _, _, t in results)
    print(f"60 concurrent GETs: {codes.count(200)} x 200, {codes.count(503)} x 503, "
          f"slowest {slowest:.2f} s")  # fmt: skip
    assert set(codes) <= {200, 503}, codes
    assert all(retry for code, retry, _ in results if code == 503)
    assert codes.count(200) >= 30


def test_open_event_streams_do_not_starve_other_requests(api: RunningService) -> None:
    with tenant_client(api) as owner:
        make_verifier(owner)
        job = make_job(owner, make_dataset(owner))  # queued on a queue nobody serves: it stays
        key = owner.headers["Authorization"]
    opened, stop = threading.Event(), threading.Event()
    count = 0
    lock = threading.Lock()

    def stream() -> None:
        nonlocal count
        headers = {"Authorization": key, "Accept": "text/event-stream"}
        with (
            httpx.Client(base_url=api.base_url, headers=headers, timeout=60) as c,
            c.stream("GET", f"/v1/jobs/{job['id']}/events") as r,
        ):
            assert r.status_code == 200
            for _ in r.iter_lines():
                with lock:
                    count += 1
                    if count >= 100:
                        opened.set()
                if stop.is_set():
                    return

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(100)]
    for t in threads:
        t.start()
    try:
        assert opened.wait(60), "the streams did not open"
        with tenant_client(api) as other:
            started = time.monotonic()
            for _ in range(5):
                assert other.get("/v1/jobs").status_code == 200
            elapsed = time.monotonic() - started
        print(f"5 reads of another tenant beside 100 open streams: {elapsed:.2f} s")
        assert elapsed < 10
    finally:
        stop.set()
        with tenant_client(api) as owner:
            owner.headers["Authorization"] = key
            owner.post(f"/v1/jobs/{job['id']}/cancel")  # the streams end with the job
        for t in threads:
            t.join(timeout=30)


def test_an_exhausted_pool_is_a_503_with_retry_after_never_a_500(
    tiny_pool_api: RunningService,
) -> None:
    with tenant_client(tiny_pool_api) as client:
        make_verifier(client)
        dataset = make_dataset(client)
        for _ in range(3):  # a longer list holds the one connection longer per request
            make_job(client, dataset)
        key = client.headers["Authorization"]
    # Whether two of a burst's requests overlap on the connection is up to the scheduler; a few
    # bursts make it certain, and every answer of every burst must be a 200 or a 503.
    results: list[tuple[int, str | None, float]] = []
    for _ in range(5):
        results += _burst(tiny_pool_api, key, 60)
        if any(code == 503 for code, _, _ in results):
            break
    codes = [code for code, _, _ in results]
    print(f"{len(codes)} GETs on a one-connection pool: {codes.count(200)} x 200, "
          f"{codes.count(503)} x 503")  # fmt: skip
    assert set(codes) <= {200, 503} and 503 in codes, codes
    assert all(retry == "1" for code, retry, _ in results if code == 503)
    with tenant_client(tiny_pool_api) as client:  # and the service is fine afterwards
        client.headers["Authorization"] = key
        assert client.get("/v1/jobs").status_code == 200
