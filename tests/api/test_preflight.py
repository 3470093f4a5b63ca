"""POST /v1/jobs/preflight at the API (no worker: it answers 202, still queued): validated as a
submission, outside the open-jobs limit, its own limit, a stranger's id is missing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Preflight
from tests.api.conftest import tenant_client
from tests.api.helpers import job_body, make_dataset, make_job, make_verifier
from tests.api.server import settings_of
from tests.e2e.services import RunningService


def test_bad_body_is_refused_exactly_as_a_job(client: httpx.Client) -> None:
    dataset = make_dataset(client)
    bad = job_body(dataset, grpo={"group_size": 1, "bogus": 1}, verifiers=[{"name": "ghost"}])
    for body in (bad, {**job_body("ds_nope"), "base_model": "nope"}):
        as_job = client.post("/v1/jobs", json=body)
        as_preflight = client.post("/v1/jobs/preflight", json=body)
        assert as_job.status_code == as_preflight.status_code == 422, as_preflight.text
        assert as_preflight.headers["content-type"].startswith("application/problem+json")
        assert as_preflight.json() == as_job.json()
    assert client.get("/v1/jobs").json()["data"] == []  # neither created anything


def test_queued_preflight_answers_202_and_polls(api: RunningService) -> None:
    owner = tenant_client(api)
    make_verifier(owner)
    dataset = make_dataset(owner)
    for _ in range(3):  # the open-jobs limit (3 here) is full ...
        make_job(owner, dataset)
    assert owner.post("/v1/jobs", json=job_body(dataset)).status_code == 429
    r = owner.post("/v1/jobs/preflight", json=job_body(dataset))  # ... and does not apply
    assert r.status_code == 202, r.text
    body = r.json()
    assert r.headers["location"] == f"/v1/jobs/preflight/{body['id']}"
    assert body["id"].startswith("pf_") and body["status"] == "queued"
    assert body["spec"]["verifiers"][0]["version"] == 1  # pinned, as a job's
    assert body["memory_estimate"]["total"] > 0 and body["reward_mean"] is None
    got = owner.get(r.headers["location"])
    assert got.status_code == 200 and got.json()["id"] == body["id"]
    assert len(owner.get("/v1/jobs").json()["data"]) == 3  # no job was created
    stranger = tenant_client(api)
    missing = stranger.get("/v1/jobs/preflight/pf_0000000000000000000000")
    theirs = stranger.get(r.headers["location"])
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["detail"].replace(body["id"], "X") == missing.json()["detail"].replace(
        "pf_0000000000000000000000", "X"
    )
    # GRPO_PREFLIGHT_MAX_OPEN (2): one more is under way, a third is refused
    assert owner.post("/v1/jobs/preflight", json=job_body(dataset)).status_code == 202
    refused = owner.post("/v1/jobs/preflight", json=job_body(dataset))
    assert refused.status_code == 429 and refused.headers["retry-after"] == "5"


def test_a_tenant_over_its_budget_is_refused_a_preflight_as_a_job(api: RunningService) -> None:
    name = f"pf-budget-{new_id('t')}"
    owner = tenant_client(api, name)
    make_verifier(owner)
    dataset = make_dataset(owner)
    api.cli("tenants", "set-budget", name, "--device-hours", "0")
    as_job = owner.post("/v1/jobs", json=job_body(dataset))
    as_preflight = owner.post("/v1/jobs/preflight", json=job_body(dataset))
    assert as_job.status_code == as_preflight.status_code == 402, as_preflight.text
    assert as_preflight.json() == as_job.json()
    assert as_preflight.json()["type"].endswith("/budget-exhausted")
    api.cli("tenants", "set-budget", name, "--clear")
    assert owner.post("/v1/jobs/preflight", json=job_body(dataset)).status_code == 202


def test_a_preflights_device_time_is_in_usage_and_the_budget(api: RunningService) -> None:
    name = f"pf-usage-{new_id('t')}"
    owner = tenant_client(api, name)
    make_verifier(owner)
    dataset = make_dataset(owner)
    tenant_id = owner.get("/v1/me").json()["tenant_id"]
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    pf_id = new_id("pf")
    ran = Preflight(id=pf_id, tenant_id=tenant_id, status="succeeded", queue="default",
                    spec={}, base_model="tiny", created_at=started, started_at=started,
                    finished_at=started + timedelta(seconds=120))  # fmt: skip
    engine = make_engine(settings_of(api).effective_database_url)
    with Session(engine) as s, s.begin():
        s.add(ran)
    engine.dispose()
    by_day = owner.get("/v1/usage").json()
    assert by_day["totals"]["device_seconds"] == 120.0
    assert by_day["totals"]["device_seconds_by_kind"] == {"preflight": 120.0}
    by_job = owner.get("/v1/usage", params={"group_by": "job"}).json()
    assert [(r["job_id"], r["device_seconds"]) for r in by_job["data"]] == [(pf_id, 120.0)]
    api.cli("tenants", "set-budget", name, "--device-hours", "0.03")  # 108 s: spent
    assert owner.get("/v1/usage").json()["budget"]["device_hours_used"] == 120 / 3600
    refused = owner.post("/v1/jobs/preflight", json=job_body(dataset))
    assert refused.status_code == 402, refused.text
    assert "used 0.0333 of 0.03 h" in refused.json()["detail"]
