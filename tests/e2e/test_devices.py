"""A job on two devices through a real worker that declares two (`--devices 2`): its training
process launches two ranks (gloo on this CPU); one rank killed stops the group, and the job
resumes from its checkpoint with nothing written twice. The worker's capacity bounds what a
submission may ask for."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.process_group import descendants
from tests.e2e.cluster import Cluster, run_cluster
from tests.e2e.services import TINY
from tests.e2e.test_faults import claims, events, metric_rows, started, trainer_pid, wait_for
from tests.e2e.test_training_flow import submit_digit_job, wait_final

TWO_DEVICES = {
    "grpo": {"steps": 6, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
    "checkpoint_every": 2,
    "resources": {"devices": 2},
}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, moto_server: str, tiny_model_dir: Path
) -> Iterator[Cluster]:
    with run_cluster(
        tmp_path_factory.mktemp("devices"), moto_server, workers=1, model=tiny_model_dir,
        worker_args=("--devices", "2"),
    ) as c:  # fmt: skip
        yield c


def _ranks(watchdog: int) -> list[int]:
    """The launcher's rank processes below a watchdog (fresh interpreters: `spawn_main`)."""
    found = []
    for pid in descendants(watchdog):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"spawn_main" in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_a_two_device_job_survives_a_killed_rank(cluster: Cluster) -> None:
    client = cluster.client("two-devices")
    job = submit_digit_job(client, TINY, **TWO_DEVICES)

    # More devices than the queue's live worker owns: refused, naming the field and capacity.
    four = {
        "base_model": TINY, "dataset": job["spec"]["dataset"], "verifiers": [{"name": "digits"}],
        "grpo": {"steps": 2, "prompts_per_step": 4, "group_size": 4},
        "resources": {"devices": 4},
    }  # fmt: skip
    r = client.post("/v1/jobs", json=four)
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert error["path"] == "$.resources.devices"
    assert "queue 'gpu' own at most 2" in error["message"]

    wait_for(lambda: started(client, job["id"], 3), "step 3", timeout=240)
    ranks = wait_for(lambda: _ranks(trainer_pid(client, job["id"], 1)), "the ranks")
    assert len(ranks) == 2, ranks
    os.kill(ranks[-1], signal.SIGKILL)  # one rank: the group stops, the attempt ends

    final = wait_final(client, job["id"], timeout=300)
    assert final["status"] == "succeeded", cluster.svc.logs()
    assert final["spec"]["resources"] == {"devices": 2}
    assert [c["epoch"] for c in claims(client, job["id"])] == [1, 2]
    failed = [e for e in events(client, job["id"]) if e["type"] == "rank_failed"]
    assert len(failed) == 1 and failed[0]["data"]["devices"] == 2, failed
    rows = metric_rows(cluster, job["id"])
    assert [step for step, _ in rows] == list(range(1, 7))  # every step exactly once
    resumed_at = min(step for step, epoch in rows if epoch == 2)
    assert resumed_at - 1 in (2, 4) and resumed_at >= 3  # from a committed checkpoint
    metrics = client.get(f"/v1/jobs/{job['id']}/metrics").json()["data"]
    assert {m["world_size"] for m in metrics} == {2.0}  # both attempts on two ranks
    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert [c["step"] for c in ckpts] == [2, 4, 6]
