"""GET /v1/usage over seeded usage rows, budgets set by the operator's CLI, and the estimate
of a spec from the model's size; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, date, datetime

import httpx
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Checkpoint, JobUsage
from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, job_body, make_dataset, make_job, make_verifier, problem
from tests.api.server import settings_of
from tests.e2e.services import TINY, RunningService

D1, D2 = date(2026, 1, 10), date(2026, 1, 11)


def seed_usage(svc: RunningService, client: httpx.Client) -> str:
    """A job with two days of usage (two device kinds on the second) and one checkpoint."""
    make_verifier(client)
    job = make_job(client, make_dataset(client))
    tenant_id = client.get("/v1/me").json()["tenant_id"]
    engine = make_engine(settings_of(svc).effective_database_url)
    rows = [(D1, "cpu", 100.0, 1000, 3000), (D2, "cpu", 30.0, 200, 600), (D2, "cuda:X", 20.0, 5, 7)]
    with Session(engine) as s, s.begin():
        for day, kind, seconds, completion, trained in rows:
            s.add(
                JobUsage(
                    job_id=job["id"], day=day, device_kind=kind, tenant_id=tenant_id, steps=2,
                    device_seconds=seconds, completion_tokens=completion, trained_tokens=trained,
                    verifier_cpu_seconds=1.5,
                )
            )  # fmt: skip
        s.add(
            Checkpoint(
                id=new_id("ckpt"), job_id=job["id"], step=2, epoch=1, object_key="x/c.tar",
                size_bytes=4096, sha256="0" * 64, format="full",
                created_at=datetime(2026, 1, 11, 12, tzinfo=UTC),
            )
        )  # fmt: skip
    engine.dispose()
    return job["id"]


def test_usage_by_day_and_by_job_and_only_the_callers(any_api: RunningService) -> None:
    owner, stranger = tenant_client(any_api), tenant_client(any_api)
    job_id = seed_usage(any_api, owner)
    window = {"from": "2026-01-10", "to": "2026-01-12"}
    by_day = owner.get("/v1/usage", params={**window, "group_by": "day"}).json()
    assert (by_day["from"], by_day["to"], by_day["budget"]) == ("2026-01-10", "2026-01-12", None)
    assert [(r["day"], r["device_seconds"], r["storage_bytes"]) for r in by_day["data"]] == [
        ("2026-01-10", 100.0, 0),
        ("2026-01-11", 50.0, 4096),
    ]
    assert by_day["data"][1]["device_seconds_by_kind"] == {"cpu": 30.0, "cuda:X": 20.0}
    totals = by_day["totals"]
    assert totals == {
        "device_seconds": 150.0, "device_seconds_by_kind": {"cpu": 130.0, "cuda:X": 20.0},
        "completion_tokens": 1205, "trained_tokens": 3607, "verifier_cpu_seconds": 4.5,
        "storage_bytes": 4096,
    }  # fmt: skip
    by_job = owner.get("/v1/usage", params={**window, "group_by": "job"}).json()
    assert [r["job_id"] for r in by_job["data"]] == [job_id]
    assert by_job["data"][0]["steps"] == 6 and by_job["totals"] == totals
    # A date-time inside a day selects that whole day.
    inside = {"from": "2026-01-11T08:00:00Z", "to": "2026-01-11T09:00:00+00:00"}
    one_day = owner.get("/v1/usage", params=inside).json()
    assert [r["day"] for r in one_day["data"]] == ["2026-01-11"]
    theirs = stranger.get("/v1/usage", params={**window, "group_by": "job"}).json()
    assert theirs["data"] == [] and theirs["totals"]["device_seconds"] == 0


def test_usage_window_defaults_and_bad_queries(api: RunningService, client: httpx.Client) -> None:
    body = client.get("/v1/usage").json()
    today = datetime.now(UTC).date()
    assert body["from"] == today.replace(day=1).isoformat() and body["to"] > body["from"]
    assert body["data"] == [] and body["totals"]["storage_bytes"] == 0
    bad = client.get("/v1/usage", params={"from": "2026-02-01", "to": "2026-01-01"})
    assert error_paths(bad) == ["query.to"] and bad.status_code == 422
    assert error_paths(client.get("/v1/usage", params={"group_by": "week"})) == ["query.group_by"]
    assert error_paths(client.get("/v1/usage", params={"from": "soon"})) == ["query.from"]


def test_a_tenant_over_its_budget_gets_402_until_it_is_cleared(api: RunningService) -> None:
    name = f"budget-{new_id('t')}"
    client = tenant_client(api, name)
    seed_usage(api, client)  # 150 device-seconds used
    dataset = client.get("/v1/jobs").json()["data"][0]["spec"]["dataset"]
    out = api.cli("tenants", "set-budget", name, "--device-hours", "0.05")  # 180 s: under it
    assert client.post("/v1/jobs", json=job_body(dataset)).status_code == 201, out
    api.cli("tenants", "set-budget", name, "--device-hours", "0.0001")
    body = problem(client.post("/v1/jobs", json=job_body(dataset)), 402)
    assert body["type"].endswith("/budget-exhausted")
    assert "used 0.0417 of 0.0001 h" in body["detail"], body
    usage = client.get("/v1/usage").json()
    assert usage["budget"] == {"device_hours_limit": 0.0001, "device_hours_used": 150 / 3600}
    api.cli("tenants", "set-budget", name, "--clear")
    assert client.post("/v1/jobs", json=job_body(dataset)).status_code == 201


def test_estimate_from_the_models_size(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    make_verifier(client)
    dataset = make_dataset(client)
    spec = job_body(dataset, generation={"max_new_tokens": 16})
    r = client.post("/v1/jobs/estimate", json=spec)
    assert r.status_code == 200, r.text
    est = r.json()
    params = client.get(f"/v1/models/{TINY}").json()["num_parameters"]
    completions = 2 * 1 * 2  # steps x prompts_per_step x group_size
    assert est["basis"] == "model_size" and est["basis_id"] is None
    assert est["completion_tokens"] == completions * 16  # every completion at max_new_tokens
    prompt_tokens, rest = divmod(est["trained_tokens"] - est["completion_tokens"], completions)
    assert rest == 0 and prompt_tokens >= 2  # the longest prompt, "Digit 1:", in tokens
    flops = params * (2 * est["completion_tokens"] + (6 + 2) * est["trained_tokens"])  # beta > 0
    assert abs(est["flops"] - flops) < 1e-6 * flops
    assert est["device_flops"] == 5e10 and est["device_seconds"] == est["flops"] / 5e10
    assert client.get("/v1/jobs").json()["data"] == []  # nothing submitted
    bad = client.post("/v1/jobs/estimate", json={**spec, "dataset": "ds_missing"})
    assert bad.status_code == 422 and error_paths(bad) == ["$.dataset"]  # the same checks
