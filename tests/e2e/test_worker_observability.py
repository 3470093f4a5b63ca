"""The worker's Prometheus metrics (across its processes) and its JSON log lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import submit_digit_job, wait_final


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, f"{name} not in worker metrics:\n{text[:2000]}"
    return float(match.group(1))


def test_worker_metrics_and_json_logs(
    production_service: RunningService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    svc = production_service
    url = f"http://127.0.0.1:{svc.worker_metrics_port}/metrics"
    before = sample(httpx.get(url).text, "grpo_worker_steps_total")
    client = svc.client(svc.new_key(f"obs-{tmp_path.name}"))
    job = submit_digit_job(client, TINY)
    assert wait_final(client, job["id"])["status"] == "succeeded", svc.logs()

    text = httpx.get(url).text  # served by the supervisor, recorded by the job's child process
    assert sample(text, "grpo_worker_steps_total") == before + 4
    assert sample(text, "grpo_worker_completion_tokens_total") > 0
    assert sample(text, "grpo_worker_step_seconds_count") >= 4

    lines = (svc.log_dir / "worker.log").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    mine = [r for r in records if r.get("job_id") == job["id"]]
    assert any(r["message"].startswith("step 4/4") for r in mine), lines[-20:]
    assert all(r["epoch"] == 1 and r["level"] and r["at"].endswith("Z") for r in mine)
