"""Usage recorded by a real tiny training job (embedded service, real worker), the estimate it
makes possible, and a device-hour budget that pauses a running job and refuses new ones."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.models import RolloutFile
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import submit_digit_job, wait_final


def rollout_bytes(svc: RunningService, job_id: str) -> int:
    engine = make_engine(svc.settings().effective_database_url)
    with Session(engine) as s:
        sizes = s.scalars(select(RolloutFile.size_bytes).where(RolloutFile.job_id == job_id))
        total = sum(sizes)
    engine.dispose()
    return total


def spec_of(job: dict[str, Any], **grpo: Any) -> dict[str, Any]:
    """A submission like `job`'s (its dataset and verifier, the version it pinned)."""
    spec = job["spec"]
    return {
        "base_model": TINY,
        "dataset": spec["dataset"],
        "verifiers": [{"name": v["name"], "version": v["version"]} for v in spec["verifiers"]],
        "grpo": {**spec["grpo"], **grpo},
        "generation": {"max_new_tokens": spec["generation"]["max_new_tokens"]},
        "checkpoint_every": spec["checkpoint_every"],
    }


def set_budget(svc: RunningService, tenant: str, device_hours: float | None) -> None:
    """`grpo-service tenants set-budget` (None: `--clear`), by the function the command calls:
    a command is a fresh interpreter, ~1.5 s of CPU (tests/api/test_usage.py runs it)."""
    from service.usage.service import set_budget as store

    with svc.session() as session:
        assert store(session, tenant, device_hours) is not None


def wait_status(client: httpx.Client, job_id: str, wanted: set[str], timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in wanted:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached {wanted}: {job}")


def test_usage_estimate_and_budget_of_real_jobs(
    embedded_service: RunningService, tmp_path: Path
) -> None:
    svc, tenant = embedded_service, f"usage-{tmp_path.name}"
    client = svc.client(svc.new_key(tenant))
    job = submit_digit_job(client, TINY)
    final = wait_final(client, job["id"])
    assert final["status"] == "succeeded", (final, svc.logs())
    metrics = client.get(f"/v1/jobs/{job['id']}/metrics").json()["data"]

    report = client.get("/v1/usage", params={"group_by": "job"}).json()
    [row] = report["data"]
    assert row["job_id"] == job["id"] and row["steps"] == 4
    assert row["device_seconds"] > sum(m["step_seconds"] for m in metrics)  # loading too
    [kind] = row["device_seconds_by_kind"]
    assert kind == "cpu" or kind.startswith("cuda:")
    assert row["completion_tokens"] == sum(m["completion_tokens"] for m in metrics) > 0
    assert row["trained_tokens"] == sum(m["trained_tokens"] for m in metrics) > 0
    assert row["verifier_cpu_seconds"] > 0  # the python sandbox's CPU
    checkpoints = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    stored = sum(c["size_bytes"] for c in checkpoints) + rollout_bytes(svc, job["id"])
    assert row["storage_bytes"] == stored > sum(c["size_bytes"] for c in checkpoints)
    by_day = client.get("/v1/usage", params={"group_by": "day"}).json()
    assert len(by_day["data"]) == 1 and by_day["totals"] == report["totals"]

    r = client.post("/v1/jobs/estimate", json=spec_of(job))
    assert r.status_code == 200, r.text
    estimate = r.json()
    assert (estimate["basis"], estimate["basis_id"]) == ("job", job["id"])
    assert estimate["completion_tokens"] == row["completion_tokens"]  # same spec, same lengths
    assert estimate["device_seconds"] == estimate["flops"] / estimate["device_flops"] > 0

    # A budget a little above what is used: the next job's first steps cross it.
    used_h = report["totals"]["device_seconds"] / 3600
    set_budget(svc, tenant, round(used_h + 0.0002, 6))
    r = client.post("/v1/jobs", json=spec_of(job, steps=40))
    assert r.status_code == 201, r.text
    paused = wait_status(client, r.json()["id"], {"paused", "succeeded", "failed", "cancelled"})
    assert paused["status"] == "paused" and 0 < paused["step"] < 40, (paused, svc.logs())
    events = client.get(f"/v1/jobs/{paused['id']}/events").json()["data"]
    [ask] = [e for e in events if e["data"].get("status") == "pausing"]
    assert ask["data"]["reason"].startswith("device-hour budget exhausted (used ")
    assert ask["data"]["budget"]["device_hours_used"] >= ask["data"]["budget"]["device_hours_limit"]
    refused = client.post("/v1/jobs", json=spec_of(job))
    assert refused.status_code == 402 and "budget exhausted" in refused.json()["detail"]
    set_budget(svc, tenant, None)
    assert client.post(f"/v1/jobs/{paused['id']}/cancel").status_code == 202
