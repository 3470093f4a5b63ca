"""The status poll reads without pre-ping (one database round trip per poll, not two): a
connection the database dropped fails the first try, and the poll is made again on a fresh
one. Here PostgreSQL ends every connection of the API while polls are pooled; the next polls
still answer 200, never a 500. Most polls are answered before the router (`service.jobs.poll`):
the same bytes as the route's, which a query string reaches (the fast path leaves those to it)."""

from __future__ import annotations

import re

import httpx
from sqlalchemy import make_url

from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.e2e.conftest import _psql
from tests.e2e.services import RunningService


def test_a_poll_survives_dropped_connections(api_pg: RunningService) -> None:
    client = tenant_client(api_pg)
    make_verifier(client)
    job = make_job(client, make_dataset(client))
    url = f"/v1/jobs/{job['id']}"
    for _ in range(8):  # the poll engine's pool now holds open connections
        assert client.get(url).status_code == 200
    database = make_url(api_pg.env["GRPO_DATABASE_URL"]).database
    _psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    )
    codes = [client.get(url).status_code for _ in range(8)]
    assert codes == [200] * 8, codes
    assert client.get(url).json()["id"] == job["id"]


def test_the_fast_path_answers_as_the_route(any_api: RunningService) -> None:
    client, stranger = tenant_client(any_api), tenant_client(any_api)
    make_verifier(client)
    make_verifier(stranger)
    job = make_job(client, make_dataset(client))
    theirs = make_job(stranger, make_dataset(stranger, "s"))
    for job_id in (job["id"], "job_missing", theirs["id"]):  # theirs: exactly as a missing one
        url = f"/v1/jobs/{job_id}"
        client.get(url)  # the key's lookup is cached now: the next poll takes the fast path
        fast, routed = client.get(url), client.get(url, params={"via": "the-router"})
        assert fast.status_code == routed.status_code == (200 if job_id == job["id"] else 404)
        assert fast.content == routed.content
        assert fast.headers["content-type"] == routed.headers["content-type"]
    assert stranger.get(f"/v1/jobs/{theirs['id']}").json()["id"] == theirs["id"]
    assert (
        client.get(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer nope"}).status_code
        == 401
    )


def test_no_other_get_route_has_the_poll_path(api: RunningService) -> None:
    """The fast path takes every GET of `/v1/jobs/{one segment}` for the poll: a route of that
    shape added elsewhere would never be reached."""
    paths = httpx.get(f"{api.base_url}/openapi.json").json()["paths"]
    shaped = [p for p, ops in paths.items() if "get" in ops and re.fullmatch(r"/v1/jobs/[^/]+", p)]
    assert shaped == ["/v1/jobs/{job_id}"]
