"""Checkpoints through a real job on the embedded service: `keep_checkpoints` prunes rows and
objects to the newest N plus the final one, the final archive is the model alone and loads,
and a job whose final checkpoint is stored finishes without training when delivered again."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import httpx
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.demo_task import digit_records
from service.models import Job
from service.settings import Settings
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import wait_final


def settings_of(svc: RunningService) -> Settings:
    return svc.settings()


def submit(client: httpx.Client, model: str, **spec: object) -> dict:
    """A job scored by a regex verifier: no sandbox needed for this one."""
    verifier = {"name": "has-digit", "kind": "regex", "config": {"pattern": "[0-9]"}}
    assert client.post("/v1/verifiers", json=verifier).status_code == 201
    jsonl = "".join(json.dumps(rec) + "\n" for rec in digit_records(8))
    r = client.post("/v1/datasets", data={"name": "d"}, files={"file": ("d.jsonl", jsonl.encode())})
    assert r.status_code == 201, r.text
    body = {
        "base_model": model,
        "dataset": r.json()["id"],
        "verifiers": [{"name": "has-digit"}],
        "generation": {"max_new_tokens": 8},
        **spec,
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def archive_names(client: httpx.Client, job_id: str, step: int) -> tuple[bytes, list[str]]:
    r = client.get(f"/v1/jobs/{job_id}/checkpoints/{step}/download")
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        return r.content, tar.getnames()


def test_keep_checkpoints_prunes_to_n_and_the_final(
    embedded_service: RunningService, tmp_path: Path
) -> None:
    svc = embedded_service
    client = svc.client(svc.new_key(f"keep-{tmp_path.name}"))
    job = submit(
        client,
        TINY,
        grpo={"steps": 5, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
        checkpoint_every=1,
        keep_checkpoints=2,
    )
    final = wait_final(client, job["id"])
    assert final["status"] == "succeeded", svc.logs()
    assert final["spec"]["keep_checkpoints"] == 2
    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert [c["step"] for c in ckpts] == [3, 4, 5]
    objects = settings_of(svc).data_path / "objects"
    stored = sorted(p.name for p in objects.rglob(f"*/jobs/{job['id']}/*/*.tar"))
    assert stored == ["step-3.tar", "step-4.tar", "step-5.tar"]  # the pruned ones' objects too
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    pruned = [e["data"]["steps"] for e in events if e["type"] == "checkpoints_pruned"]
    assert pruned == [[1], [2]]

    _, periodic = archive_names(client, job["id"], 4)
    assert "trainer_state.pt" in periodic  # resumable
    data, names = archive_names(client, job["id"], 5)
    assert "trainer_state.pt" not in names and "model.safetensors" in names
    assert len(data) == ckpts[-1]["size_bytes"]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp_path / "final", filter="data")
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "final")

    # The final checkpoint committed, then the worker died before marking the job done: a new
    # delivery finds the training complete and trains nothing (there is no state to resume).
    settings = settings_of(svc)
    engine = make_engine(settings.effective_database_url)
    with Session(engine) as s, s.begin():
        s.execute(update(Job).where(Job.id == job["id"]).values(status="queued", finished_at=None))
    engine.dispose()
    from service.worker import make_celery

    make_celery(settings).send_task("grpo.train_job", args=[job["id"]], queue="gpu")
    again = wait_final(client, job["id"], timeout=120)
    assert again["status"] == "succeeded" and again["error"] is None, svc.logs()
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    claims = [e["data"]["epoch"] for e in events if e["data"].get("status") == "running"]
    assert claims == [1, 2]
    resumed = [e["data"] for e in events if e["type"] == "resumed"]
    assert resumed == [{"from_step": 5, "redo_steps": 0, "final": True}]
    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert [c["step"] for c in ckpts] == [3, 4, 5]
    assert client.delete(f"/v1/jobs/{job['id']}/checkpoints/3").status_code == 204
    assert not list(objects.rglob(f"*/jobs/{job['id']}/*/step-3.tar"))
