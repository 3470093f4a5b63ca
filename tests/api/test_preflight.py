"""POST /v1/jobs/preflight at the API (no worker: it answers 202, still queued): validated as a
submission, outside the open-jobs limit, its own limit, a stranger's id is missing."""

from __future__ import annotations

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import job_body, make_dataset, make_job, make_verifier
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
