"""The whole path through real processes: key -> verifier -> dataset -> job -> checkpoint, with
the job's wake-up delivered twice (only one run trains it)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx

from service.demo_task import DIGIT_VERIFIER_SOURCE, digit_records
from tests.e2e.services import TINY, RunningService

REQUIRED_METRICS = {
    "reward_mean", "reward_std", "reward/digits", "frac_zero_std_groups", "advantage_abs_mean",
    "loss", "kl", "clip_ratio", "entropy", "completion_len_mean", "truncated_frac", "grad_norm",
    "learning_rate", "step_seconds", "tokens_per_second",
}  # fmt: skip


def wait_final(client: httpx.Client, job_id: str, timeout: float = 400) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def submit_digit_job(
    client: httpx.Client, model: str, with_eval: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Register the digits verifier and dataset, then submit a short job on catalog `model`."""
    r = client.post(
        "/v1/verifiers",
        json={"name": "digits", "kind": "python", "config": {"source": DIGIT_VERIFIER_SOURCE}},
    )
    assert r.status_code == 201, r.text
    jsonl = "".join(json.dumps(rec) + "\n" for rec in digit_records(16))
    r = client.post(
        "/v1/datasets", data={"name": "digits"}, files={"file": ("d.jsonl", jsonl.encode())}
    )
    assert r.status_code == 201, r.text
    dataset = r.json()
    assert dataset["num_records"] == 16 and dataset["id"].startswith("ds_")
    spec = {
        "base_model": model,
        "dataset": dataset["id"],
        "verifiers": [{"name": "digits"}],
        "grpo": {"steps": 4, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
        "generation": {"max_new_tokens": 8},
        "checkpoint_every": 2,
        **({"eval_dataset": dataset["id"], "eval_every": 2} if with_eval else {}),
        **overrides,
    }
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "queued" and job["total_steps"] == spec["grpo"]["steps"]
    assert job["spec"]["verifiers"][0]["version"] == 1  # pinned at submission
    return job


def check_training_flow(svc: RunningService, tmp_path: Path) -> None:
    client = svc.client(svc.new_key(f"tenant-{tmp_path.name}"))
    job = submit_digit_job(client, TINY, with_eval=True)
    # The broker may deliver a job twice; the claim in the database lets only one run train.
    from service.worker import make_celery

    make_celery(svc.settings()).send_task("grpo.train_job", args=[job["id"]], queue="gpu")
    final = wait_final(client, job["id"])
    assert final["status"] == "succeeded", (final, svc.logs())
    assert final["step"] == 4 and final["started_at"] and final["finished_at"]

    page = client.get(f"/v1/jobs/{job['id']}/metrics").json()
    rows = page["data"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    verifier = client.get("/v1/verifiers/digits").json()
    assert page["verifiers"] == [
        {"name": "digits", "version": 1, "weight": 1.0, "sha256": verifier["sha256"]}
    ]
    assert set(rows[0]) >= REQUIRED_METRICS, set(rows[0])
    assert client.get(f"/v1/jobs/{job['id']}/metrics?after_step=2").json()["data"][0]["step"] == 3

    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    statuses = [e["data"].get("status") for e in events if e["type"] == "status"]
    assert statuses == ["queued", "running", "succeeded"], events
    assert sum(e["data"].get("status") == "running" for e in events) == 1  # one run, not two
    assert sum(e["type"] == "checkpoint" for e in events) == 2

    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert [(c["step"], c["format"]) for c in ckpts] == [(2, "full"), (4, "full")]
    r = client.get(f"/v1/jobs/{job['id']}/checkpoints/latest/download")
    assert r.status_code == 200
    assert hashlib.sha256(r.content).hexdigest() == ckpts[-1]["sha256"]
    assert len(r.content) == ckpts[-1]["size_bytes"]

    out = tmp_path / "ckpt"
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        tar.extractall(out, filter="data")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_out = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("Digit 3:", return_tensors="pt").input_ids
    generated = model_out.generate(ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > ids.shape[1]


def test_embedded_mode_trains_end_to_end(embedded_service: RunningService, tmp_path: Path) -> None:
    check_training_flow(embedded_service, tmp_path)


def test_production_mode_trains_end_to_end(
    production_service: RunningService, tmp_path: Path
) -> None:
    check_training_flow(production_service, tmp_path)
