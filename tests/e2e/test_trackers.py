"""Trackers through a real worker (issue 17 item 3): a job reporting to TensorBoard and MLflow
(sqlite:// store) trains; its events download as a tar.gz that TensorBoard reads, and its MLflow
run holds every step. A job whose W&B key cannot be checked still succeeds, with one warning
that never shows the key."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.demo_task import digit_records
from tests.e2e.services import TINY, RunningService, run_service
from tests.e2e.test_training_flow import wait_final
from tests.workers.tracking.readers import scalars

STEPS = 4
WANDB_KEY = "wk" * 20


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RunningService]:
    work = tmp_path_factory.mktemp("trackers-e2e")
    env = {
        "GRPO_MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "WANDB_INIT_TIMEOUT": "3",  # W&B's server is out of reach here: fail fast
    }
    with run_service(env, work, embedded=True, model=tiny_model_dir) as svc:
        yield svc


def _submit(client: httpx.Client, dataset: str, **spec: Any) -> str:
    body = {
        "base_model": TINY,
        "dataset": dataset,
        "verifiers": [{"name": "has-digit"}],
        "grpo": {"steps": STEPS, "prompts_per_step": 2, "group_size": 2},
        "generation": {"max_new_tokens": 4},
        "checkpoint_every": 2,
        "rollouts": "none",
        **spec,
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture(scope="module")
def jobs(service: RunningService) -> tuple[httpx.Client, dict[str, dict[str, Any]]]:
    client = service.client(service.new_key("trackers-e2e"))
    verifier = {"name": "has-digit", "kind": "regex", "config": {"pattern": "[0-9]"}}
    assert client.post("/v1/verifiers", json=verifier).status_code == 201
    jsonl = "".join(json.dumps(rec) + "\n" for rec in digit_records(4))
    r = client.post("/v1/datasets", data={"name": "d"}, files={"file": ("d.jsonl", jsonl.encode())})
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    r = client.post("/v1/secrets", json={"name": "wandb-key", "value": WANDB_KEY})
    assert r.status_code == 200, r.text
    ids = {
        "tb": _submit(client, ds, name="tb-run", report_to=["tensorboard", "mlflow"],
                      tracker_project="e2e"),
        "wandb": _submit(client, ds, report_to=["wandb"], wandb_secret="wandb-key"),
    }  # fmt: skip
    return client, {kind: wait_final(client, job_id) for kind, job_id in ids.items()}


def test_tensorboard_events_download_and_read_back(
    jobs: tuple[httpx.Client, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    client, done = jobs
    job = done["tb"]
    assert job["status"] == "succeeded", job
    r = client.get(f"/v1/jobs/{job['id']}/tensorboard")
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as archive:
        names = archive.getnames()
        archive.extractall(tmp_path, filter="data")
    assert names and all(n.startswith(f"{job['id']}/events.out.tfevents.") for n in names)
    points = scalars(tmp_path / job["id"], "reward_mean")
    assert [step for step, _ in points] == list(range(1, STEPS + 1))
    metrics = client.get(f"/v1/jobs/{job['id']}/metrics").json()["data"]
    assert [round(v, 5) for _, v in points] == [round(m["reward_mean"], 5) for m in metrics]


def test_the_mlflow_run_holds_every_step(
    service: RunningService, jobs: tuple[httpx.Client, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    client, done = jobs
    job = done["tb"]
    mlflow = MlflowClient(service.env["GRPO_MLFLOW_TRACKING_URI"])
    experiment = mlflow.get_experiment_by_name("e2e")
    (run,) = mlflow.search_runs([experiment.experiment_id])
    assert run.data.tags["grpo.job_id"] == job["id"] and run.info.run_name == "tb-run"
    assert run.info.status == "FINISHED"
    history = mlflow.get_metric_history(run.info.run_id, "reward_mean")
    assert [m.step for m in history] == list(range(1, STEPS + 1))
    assert run.data.params["grpo.steps"] == str(STEPS)
    assert run.data.params["dataset"] == job["spec"]["dataset"]
    # the rollouts of each step reach the run's sample table (at most 16 a step)
    path = mlflow.download_artifacts(run.info.run_id, "samples/train.json", str(tmp_path))
    table = json.loads(Path(path).read_text())
    steps = [row[table["columns"].index("step")] for row in table["data"]]
    assert set(steps) == set(range(1, STEPS + 1)) and len(steps) <= 16 * STEPS
    assert {"completion", "reward", "advantage"} <= set(table["columns"])


def test_a_tracker_that_fails_is_one_warning_and_the_job_succeeds(
    service: RunningService, jobs: tuple[httpx.Client, dict[str, dict[str, Any]]]
) -> None:
    client, done = jobs
    job = done["wandb"]
    assert job["status"] == "succeeded", job
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    # (this tiny run may also get the flat-reward warning, which has no `tracker`)
    warnings = [e for e in events if e["type"] == "warning" and "tracker" in e["data"]]
    assert len(warnings) == 1 and warnings[0]["data"]["tracker"] == "wandb", warnings
    assert "tracker wandb" in warnings[0]["message"]
    assert WANDB_KEY not in json.dumps(events) and WANDB_KEY not in service.logs()


def test_tensorboard_download_is_404_without_events_or_for_another_tenant(
    service: RunningService, jobs: tuple[httpx.Client, dict[str, dict[str, Any]]]
) -> None:
    client, done = jobs
    assert client.get(f"/v1/jobs/{done['wandb']['id']}/tensorboard").status_code == 404
    stranger = service.client(service.new_key("trackers-stranger"))
    theirs = stranger.get(f"/v1/jobs/{done['tb']['id']}/tensorboard")
    missing = stranger.get("/v1/jobs/job_missing/tensorboard")
    assert theirs.status_code == missing.status_code == 404
    assert (
        theirs.json()["detail"].replace(done["tb"]["id"], "job_missing") == missing.json()["detail"]
    )
