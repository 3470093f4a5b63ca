"""Cancellation: the trainer stops at the next step boundary and the job ends `cancelled`."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.services import IDLE_QUEUE, TINY, RunningService
from tests.e2e.test_training_flow import submit_digit_job, wait_final


def test_cancel_running_then_finished_answers_409(
    embedded_service: RunningService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    client = embedded_service.client(embedded_service.new_key(f"cancel-{tmp_path.name}"))
    job = submit_digit_job(
        client,
        TINY,
        grpo={"steps": 500, "prompts_per_step": 2, "group_size": 4},
        checkpoint_every=1000,
    )
    deadline = time.monotonic() + 120
    while client.get(f"/v1/jobs/{job['id']}").json()["step"] < 1:
        assert time.monotonic() < deadline, embedded_service.logs()
        time.sleep(0.2)
    r = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelling"
    final = wait_final(client, job["id"], timeout=60)
    assert final["status"] == "cancelled" and final["step"] < 500
    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert ckpts == []  # a cancelled run saves nothing further
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 409


def test_cancel_queued_job_never_runs(embedded_service: RunningService, tmp_path: Path) -> None:
    client = embedded_service.client(embedded_service.new_key(f"cancelq-{tmp_path.name}"))
    # a job on a queue no worker consumes stays queued until cancelled
    job = submit_digit_job(client, TINY, queue=IDLE_QUEUE)
    r = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    assert client.get("/v1/jobs?status=cancelled").json()["data"][0]["id"] == job["id"]
