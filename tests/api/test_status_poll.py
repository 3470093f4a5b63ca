"""The status poll (`GET /v1/jobs/{id}`), an ordinary route: it survives PostgreSQL ending
every connection of the API (the next polls answer 200, never a 500); it answers the job as
the job list shows it, and another tenant's job exactly as a missing one (404); a bad key is
a 401."""

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
    for _ in range(8):  # the API's pool now holds open connections
        assert client.get(url).status_code == 200
    database = make_url(api_pg.env["GRPO_DATABASE_URL"]).database
    _psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    )
    codes = [client.get(url).status_code for _ in range(8)]
    assert codes == [200] * 8, codes
    assert client.get(url).json()["id"] == job["id"]


def test_the_poll_answers_its_own_tenant_only(any_api: RunningService) -> None:
    client, stranger = tenant_client(any_api), tenant_client(any_api)
    make_verifier(client)
    make_verifier(stranger)
    job = make_job(client, make_dataset(client))
    theirs = make_job(stranger, make_dataset(stranger, "s"))
    poll = client.get(f"/v1/jobs/{job['id']}")
    assert poll.status_code == 200 and poll.headers["content-type"] == "application/json"
    listed = client.get("/v1/jobs").json()["data"]
    assert poll.json() == next(j for j in listed if j["id"] == job["id"])
    missing, foreign = client.get("/v1/jobs/job_missing"), client.get(f"/v1/jobs/{theirs['id']}")
    for answer, job_id in ((missing, "job_missing"), (foreign, theirs["id"])):
        assert answer.status_code == 404
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["detail"] == missing.json()["detail"].replace("job_missing", job_id)
    assert stranger.get(f"/v1/jobs/{theirs['id']}").json()["id"] == theirs["id"]
    bad_key = client.get(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer nope"})
    assert bad_key.status_code == 401
