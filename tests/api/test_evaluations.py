"""POST /v1/evaluations at the API (no worker takes its queue): the 422s naming each field,
another tenant's dataset or checkpoint read as missing, the budget's 402, reads, lists,
samples paging and cancel. Runs end to end: tests/e2e/test_evaluations.py."""

from __future__ import annotations

import httpx
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Job
from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, evaluation_body, make_dataset, make_verifier, problem
from tests.api.server import settings_of
from tests.api.test_downloads import seed_checkpoint
from tests.api.test_usage import seed_usage
from tests.e2e.services import TINY, RunningService


def _refusal(client: httpx.Client, body: dict) -> dict:
    return problem(client.post("/v1/evaluations", json=body), 422)


def test_bad_input_names_the_field(api: RunningService) -> None:
    client = tenant_client(api)
    make_verifier(client)
    dataset = make_dataset(client)
    big = make_dataset(client, "big", 11)  # GRPO_EVAL_MAX_RECORDS is 10 here
    cases = [
        ("$.samples_per_prompt", evaluation_body(dataset, samples_per_prompt=65)),
        ("$.verifiers", evaluation_body(dataset, verifiers=[])),
        ("$.dataset", evaluation_body(big)),
        ("$.max_records", evaluation_body(dataset, max_records=11)),
        ("$.model", evaluation_body(dataset, model="no-such-model")),
        ("$.model", evaluation_body(dataset, model="ft:tiny::0000000000000000000000")),
        ("$.verifiers[0].name", evaluation_body(dataset, verifiers=[{"name": "ghost"}])),
        ("$.queue", evaluation_body(dataset, queue="nowhere")),
    ]
    for path, body in cases:
        r = client.post("/v1/evaluations", json=body)
        assert r.status_code == 422 and path in error_paths(r), (path, r.text)
    assert "GRPO_EVAL_MAX_RECORDS" in _refusal(client, cases[2][1])["detail"]
    # max_records under the limit makes the big dataset fine
    ok = client.post("/v1/evaluations", json=evaluation_body(big, max_records=10))
    assert ok.status_code == 201, ok.text
    assert ok.json()["records"] == 10
    assert client.get("/v1/evaluations").json()["data"][0]["id"] == ok.json()["id"]


def test_another_tenants_dataset_and_checkpoint_read_as_missing(api: RunningService) -> None:
    owner, stranger = tenant_client(api), tenant_client(api)
    job_id, _ = seed_checkpoint(api, owner, b"tar")
    (ckpt,) = owner.get(f"/v1/jobs/{job_id}/checkpoints").json()["data"]
    dataset = owner.get(f"/v1/jobs/{job_id}").json()["spec"]["dataset"]
    assert owner.post("/v1/evaluations", json=evaluation_body(dataset, model=ckpt["id"])).is_success
    make_verifier(stranger)
    mine = make_dataset(stranger)
    for field, theirs, missing in (
        ("dataset", dataset, "ds_0000000000000000000000"),
        ("model", ckpt["id"], "ckpt_0000000000000000000000"),
    ):
        bodies = [{**evaluation_body(mine), field: v} for v in (theirs, missing)]
        a, b = (_refusal(stranger, body) for body in bodies)
        assert error_paths_of(a) == error_paths_of(b) == [f"$.{field}"]
        assert a["detail"].replace(theirs, "X") == b["detail"].replace(missing, "X")


def error_paths_of(body: dict) -> list[str]:
    return [e["path"] for e in body["errors"]]


def test_read_list_samples_and_cancel(api: RunningService) -> None:
    client = tenant_client(api)
    make_verifier(client)
    dataset = make_dataset(client)
    created = [
        client.post("/v1/evaluations", json=evaluation_body(dataset, samples_per_prompt=8))
        for _ in range(3)
    ]
    assert all(r.status_code == 201 for r in created), created[0].text
    first = created[0].json()
    assert first["id"].startswith("eval_") and first["status"] == "queued"
    assert first["verifiers"][0]["version"] == 1 and first["results"] is None
    assert first["samples_per_prompt"] == 8 and first["pass_threshold"] == 1.0
    assert first["usage"] == {"device_seconds": 0.0, "completion_tokens": 0}
    page = client.get("/v1/evaluations", params={"limit": 2}).json()
    assert [e["id"] for e in page["data"]] == [created[2].json()["id"], created[1].json()["id"]]
    assert page["has_more"] and page["next"] == created[1].json()["id"]
    rest = client.get("/v1/evaluations", params={"limit": 2, "after": page["next"]}).json()
    assert [e["id"] for e in rest["data"]] == [first["id"]] and not rest["has_more"]
    samples = client.get(f"/v1/evaluations/{first['id']}/samples").json()
    assert samples == {"data": [], "has_more": False, "next": None}
    bad = client.get(f"/v1/evaluations/{first['id']}/samples", params={"after": "x"})
    assert error_paths(bad) == ["query.after"]
    cancelled = client.post(f"/v1/evaluations/{first['id']}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
    problem(client.post(f"/v1/evaluations/{first['id']}/cancel"), 409)
    assert client.get(f"/v1/evaluations/{first['id']}").json()["status"] == "cancelled"


def test_a_tenant_over_its_budget_gets_402(api: RunningService) -> None:
    name = f"budget-{new_id('t')}"
    client = tenant_client(api, name)
    seed_usage(api, client)  # 150 device-seconds used; its verifier is em
    dataset = make_dataset(client, "evals")
    api.cli("tenants", "set-budget", name, "--device-hours", "0.0001")
    body = problem(client.post("/v1/evaluations", json=evaluation_body(dataset)), 402)
    assert body["type"].endswith("/budget-exhausted")
    # the 422s come first, as for jobs
    _refusal(client, evaluation_body(dataset, samples_per_prompt=65))


def test_a_fine_tuned_model_is_its_final_checkpoint(api: RunningService) -> None:
    owner, stranger = tenant_client(api), tenant_client(api)
    job_id, _ = seed_checkpoint(api, owner, b"tar")
    dataset = owner.get(f"/v1/jobs/{job_id}").json()["spec"]["dataset"]
    engine = make_engine(settings_of(api).effective_database_url)
    with Session(engine) as s, s.begin():  # as a succeeded fine-tuning job leaves its row
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="succeeded", fine_tuning={"model": TINY, "suffix": "x"})
        )
    engine.dispose()
    name = f"ft:{TINY}:x:{job_id.removeprefix('job_')}"
    made = owner.post("/v1/evaluations", json=evaluation_body(dataset, model=name))
    assert made.status_code == 201, made.text
    assert made.json()["model"] == name
    make_verifier(stranger)
    theirs = _refusal(stranger, evaluation_body(make_dataset(stranger), model=name))
    assert error_paths_of(theirs) == ["$.model"] and "neither a catalog model" in theirs["detail"]


def test_a_checkpoints_evaluation_samples_as_its_job_did(api: RunningService) -> None:
    """No `generation` given: a job checkpoint is evaluated with the job's own settings (what it
    was trained to answer with); a catalog model with the defaults; given ones are kept."""
    client = tenant_client(api)
    trained_with = {"max_new_tokens": 24, "temperature": 0.7}
    job_id, _ = seed_checkpoint(api, client, b"tar", generation=trained_with)
    ckpt_id = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["data"][0]["id"]
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["spec"]["generation"]["max_new_tokens"] == 24
    dataset = job["spec"]["dataset"]
    made = client.post("/v1/evaluations", json=evaluation_body(dataset, model=ckpt_id))
    assert made.status_code == 201, made.text
    assert made.json()["generation"] == job["spec"]["generation"]
    base = client.post("/v1/evaluations", json=evaluation_body(dataset))
    assert base.json()["generation"]["max_new_tokens"] == 256  # the engine's default
    given = {"max_new_tokens": 7, "temperature": 0.5}
    own = client.post("/v1/evaluations", json=evaluation_body(dataset, generation=given))
    assert own.json()["generation"]["max_new_tokens"] == 7
    for row in (made, base, own):
        assert client.post(f"/v1/evaluations/{row.json()['id']}/cancel").status_code == 202
