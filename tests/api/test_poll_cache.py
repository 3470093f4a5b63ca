"""The status-poll cache (`service.jobs.poll_cache`, PostgreSQL): a change made by another
connection (a worker's) shows well within the cache's TTL, this process's own cancel shows at
the very next poll, a killed listener connection never leaves a stale answer and comes back,
and another tenant's job stays a 404."""

from __future__ import annotations

import time

import httpx
import psycopg
from sqlalchemy import make_url

from service.jobs.poll_cache import CHANNEL, POLL_CACHE_TTL_S
from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.e2e.services import RunningService


def _connect(svc: RunningService) -> psycopg.Connection:
    url = make_url(svc.env["GRPO_DATABASE_URL"]).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


def _listeners(svc: RunningService) -> list[int]:
    with _connect(svc) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            (f"LISTEN {CHANNEL}",),
        ).fetchall()
    return [pid for (pid,) in rows]


def _wait_for_listener(svc: RunningService, timeout_s: float = 10) -> list[int]:
    """The listener's backends; the API starts listening at its first status poll."""
    deadline = time.monotonic() + timeout_s
    while not (pids := _listeners(svc)):
        assert time.monotonic() < deadline, "the poll cache's listener never connected"
        time.sleep(0.1)
    return pids


def _set_step(svc: RunningService, job_id: str, step: int) -> None:
    with _connect(svc) as conn:  # another connection, as a worker's
        conn.execute("UPDATE jobs SET step = %s WHERE id = %s", (step, job_id))


def _poll_until_step(client: httpx.Client, url: str, step: int, within_s: float) -> float:
    started = time.monotonic()
    while client.get(url).json()["step"] != step:
        assert time.monotonic() - started < within_s, f"step {step} not seen in {within_s} s"
    return time.monotonic() - started


def test_a_change_by_another_connection_shows_before_the_ttl(api_pg: RunningService) -> None:
    client = tenant_client(api_pg)
    make_verifier(client)
    job = make_job(client, make_dataset(client))
    url = f"/v1/jobs/{job['id']}"
    client.get(url)
    _wait_for_listener(api_pg)
    previous = 0
    for step in (3, 4, 5):
        for _ in range(5):  # cached now
            assert client.get(url).json()["step"] == previous
        _set_step(api_pg, job["id"], step)
        # the notification, not the TTL: seen in well under one TTL after the commit
        assert _poll_until_step(client, url, step, POLL_CACHE_TTL_S / 2) < POLL_CACHE_TTL_S / 2
        previous = step


def test_own_cancel_shows_at_the_next_poll(api_pg: RunningService) -> None:
    client = tenant_client(api_pg)
    make_verifier(client)
    client.get("/v1/jobs/job_missing")
    _wait_for_listener(api_pg)
    for _ in range(5):  # no waiting for a notification anywhere: cancel, then poll at once
        job = make_job(client, make_dataset(client))
        url = f"/v1/jobs/{job['id']}"
        for _ in range(5):
            assert client.get(url).json()["status"] == "queued"
        assert client.post(f"{url}/cancel").status_code == 202
        assert client.get(url).json()["status"] == "cancelled"


def test_a_killed_listener_leaves_no_stale_answer(api_pg: RunningService) -> None:
    client, stranger = tenant_client(api_pg), tenant_client(api_pg)
    make_verifier(client)
    job = make_job(client, make_dataset(client))
    url = f"/v1/jobs/{job['id']}"
    client.get(url)
    listeners = _wait_for_listener(api_pg)
    for _ in range(5):
        assert client.get(url).json()["step"] == 0
    with _connect(api_pg) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (listeners,))
    _set_step(api_pg, job["id"], 7)  # its notification goes to no one
    time.sleep(0.2)  # the API has seen its listener's connection end
    assert client.get(url).json()["step"] == 7  # cleared, then read again
    back = _wait_for_listener(api_pg)
    assert set(back).isdisjoint(listeners)  # a new connection: the cache is in use again
    _set_step(api_pg, job["id"], 8)
    _poll_until_step(client, url, 8, POLL_CACHE_TTL_S / 2)
    for _ in range(3):  # cached for its tenant only: another tenant's poll is a 404
        assert stranger.get(url).status_code == 404
        assert client.get(url).status_code == 200
