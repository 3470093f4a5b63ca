"""Pause, resume and fork through a real worker: a paused job checkpoints at a step boundary and
frees the worker (its fork trains meanwhile), then resumes with no step lost or repeated; the
fork continues from its fork point with another learning rate."""

from __future__ import annotations

import time
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.models import JobMetric
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import submit_digit_job, wait_final

STEPS, LR, FORK_LR = 10, 1e-3, 4e-3


def _wait_for(client: httpx.Client, job_id: str, done: Any, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if done(job):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never got there: {job}")


def _events(client: httpx.Client, job_id: str, type_: str) -> list[dict]:
    events = client.get(f"/v1/jobs/{job_id}/events").json()["data"]
    return [e for e in events if e["type"] == type_]


def test_pause_frees_the_worker_resume_loses_no_step_and_a_fork_goes_on(
    embedded_service: RunningService,
) -> None:
    svc = embedded_service
    client = svc.client(svc.new_key("pause-fork"))
    grpo = {"steps": STEPS, "prompts_per_step": 2, "group_size": 4, "learning_rate": LR}
    # No periodic checkpoint: the one the parent resumes from is the pause's own.
    job = submit_digit_job(client, TINY, grpo=grpo, checkpoint_every=1000)
    _wait_for(client, job["id"], lambda j: j["step"] >= 2)
    r = client.post(f"/v1/jobs/{job['id']}/pause")
    assert r.status_code == 200 and r.json()["status"] == "pausing", r.text
    paused = _wait_for(client, job["id"], lambda j: j["status"] != "pausing")
    assert paused["status"] == "paused", svc.logs()
    k = paused["step"]
    assert 2 <= k < STEPS
    (point,) = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert point["step"] == k  # saved at the step boundary it stopped at

    # The worker is free: the fork (from the pause's checkpoint, another learning rate) runs.
    r = client.post(
        f"/v1/jobs/{job['id']}/fork",
        json={"step": "latest", "overrides": {"grpo": {"learning_rate": FORK_LR, "steps": k + 3}}},
    )
    assert r.status_code == 201, r.text
    fork = wait_final(client, r.json()["id"], timeout=120)
    assert fork["status"] == "succeeded", svc.logs()
    assert fork["forked_from"] == {"job_id": job["id"], "step": k, "checkpoint_id": point["id"]}
    rows = client.get(f"/v1/jobs/{fork['id']}/metrics").json()["data"]
    assert [row["step"] for row in rows] == [k + 1, k + 2, k + 3]
    assert {row["learning_rate"] for row in rows} == {FORK_LR}
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "paused"  # waited meanwhile

    r = client.post(f"/v1/jobs/{job['id']}/resume")
    assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    final = wait_final(client, job["id"], timeout=120)
    assert final["status"] == "succeeded" and final["step"] == STEPS, svc.logs()
    rows = client.get(f"/v1/jobs/{job['id']}/metrics").json()["data"]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    assert {row["learning_rate"] for row in rows} == {LR}
    (resumed,) = _events(client, job["id"], "resumed")
    assert resumed["data"] == {"from_step": k, "redo_steps": 0}
    # Each step written once, by the attempt that trained it: none redone after the resume.
    engine = make_engine(svc.settings().effective_database_url)
    with Session(engine) as s:
        epochs = dict(
            (step, epoch)
            for step, epoch in s.execute(
                select(JobMetric.step, JobMetric.epoch).where(JobMetric.job_id == job["id"])
            )
        )
    engine.dispose()
    assert epochs == {step: 1 if step <= k else 2 for step in range(1, STEPS + 1)}
    statuses = [e["data"]["status"] for e in _events(client, job["id"], "status")]
    assert statuses == ["queued", "running", "pausing", "paused", "queued", "running", "succeeded"]
