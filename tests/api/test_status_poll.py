"""The status poll reads through an engine without pre-ping (one database round trip per poll,
not two): a connection the database dropped fails the first try, and the poll is made again
on a fresh one. Here PostgreSQL ends every connection of the API while polls are pooled; the
next polls still answer 200, never a 500."""

from __future__ import annotations

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
