"""A job on two devices through a real worker that declares two (`--devices 2`): its training
process launches two ranks (gloo on this CPU); one rank killed stops the group, and the job
resumes from its checkpoint with nothing written twice. The worker's capacity bounds what a
submission may ask for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.demo_task import digit_records
from service.process_group import descendants
from tests.e2e.cluster import Cluster, run_cluster
from tests.e2e.services import TINY, _spawn
from tests.e2e.test_faults import claims, events, metric_rows, started, trainer_pid, wait_for
from tests.e2e.test_training_flow import submit_digit_job, wait_final
from workers.grpo.data import PromptStream

TWO_DEVICES = {
    "grpo": {"steps": 6, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
    "checkpoint_every": 2,
    "resources": {"devices": 2},
}
# No test here loses a message. A short wait re-enqueues a job whose message the worker holds
# while its pool replaces a process, and each such duplicate costs the worker ~5 s later: in the
# group test, ~20 s of the next job's wait.
PATIENT_REQUEUE = {"GRPO_REQUEUE_AFTER_SECONDS": "30"}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, moto_server: str, tiny_model_dir: Path
) -> Iterator[Cluster]:
    with run_cluster(
        tmp_path_factory.mktemp("devices"), moto_server, workers=1, model=tiny_model_dir,
        worker_args=("--devices", "2"), extra_env=PATIENT_REQUEUE,
    ) as c:  # fmt: skip
        yield c


def _ranks(watchdog: int) -> list[int]:
    """The launcher's rank processes below a watchdog: the children of its forkserver (they
    carry the server's command line)."""
    forked = []
    for pid in descendants(watchdog):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"multiprocessing.forkserver" in fh.read():
                    forked.append(pid)
        except OSError:
            continue
    return [pid for pid in forked if _parent(pid) in forked]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


# Scores digits as the demo verifier does; spins past its deadline on a record marked `spin`.
SPINNING_VERIFIER = """
def verify(prompt, completion, digit, spin=False, **fields):
    while spin:
        pass
    return 1.0 if str(digit) in completion else 0.0
"""


# The module's first job: `failed` is written once its group has ended, while a job that
# succeeds leaves its ranks winding down (~5 s) before the worker takes the next job.
def test_an_error_on_rank_1_fails_the_job_as_on_rank_0(cluster: Cluster) -> None:
    """Rank 1's verifier spends its budget (one timeout, max_failures 0) on the record only rank
    1 draws at step 1: the job fails with rank 1's error code, not retried as a crash."""
    client = cluster.client("rank-error")
    config = {"source": SPINNING_VERIFIER, "timeout_s": 3.0, "max_failures": 0}
    r = client.post("/v1/verifiers", json={"name": "spins", "kind": "python", "config": config})
    assert r.status_code == 201, r.text
    records = digit_records(16)
    _, rank1 = PromptStream(len(records), 0).take(2)  # step 1: rank 0's record, rank 1's
    records[rank1]["spin"] = True
    jsonl = "".join(json.dumps(rec) + "\n" for rec in records)
    r = client.post("/v1/datasets", data={"name": "spins"}, files={"file": ("s.jsonl", jsonl)})
    assert r.status_code == 201, r.text
    spec = {
        "base_model": TINY, "dataset": r.json()["id"], "verifiers": [{"name": "spins"}],
        "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 4, "seed": 0},
        "generation": {"max_new_tokens": 8}, "resources": {"devices": 2},
    }  # fmt: skip
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    job = r.json()
    final = wait_final(client, job["id"], timeout=300)
    assert final["status"] == "failed", cluster.svc.logs()
    assert final["error"]["code"] == "verifier_budget_exceeded", final["error"]
    assert final["error"]["message"].startswith("rank 1 of 2: verifier 'spins' exceeded"), final
    assert len(claims(client, job["id"])) == 1  # not retried
    ended = [e for e in events(client, job["id"]) if e["type"] in ("rank_failed", "attempt_ended")]
    assert not ended, ended


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
    assert final["spec"]["resources"] == {"devices": 2, "rollout_devices": 0}
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


def _alive(pid: int) -> bool:
    """A live process (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _group_of(client: httpx.Client, job_id: str, epoch: int) -> list[int]:
    """The attempt's training process and both its ranks, once they run (pids)."""
    watchdog = trainer_pid(client, job_id, epoch)
    wait_for(lambda: len(_ranks(watchdog)) == 2, "the two ranks")
    return descendants(watchdog)


def _gone(pids: list[int], what: str) -> None:
    wait_for(lambda: not any(_alive(p) for p in pids), what, timeout=120)


def test_pause_cancel_and_sigterm_hold_for_the_whole_group(cluster: Cluster) -> None:
    """Pause checkpoints both ranks at a step boundary and frees the worker's two devices (a
    second 2-device job runs, and its cancel stops every rank); resume goes on from the pause;
    SIGTERM to the worker hands the job back, and a new worker finishes it: every step once."""
    client = cluster.client("group-control")
    steps = 8
    grpo = {"steps": steps, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3}
    job = submit_digit_job(client, TINY, grpo=grpo, checkpoint_every=1000,
                           resources={"devices": 2})  # fmt: skip
    wait_for(lambda: started(client, job["id"], 2), "step 2", timeout=240)
    group = _group_of(client, job["id"], 1)
    r = client.post(f"/v1/jobs/{job['id']}/pause")
    assert r.status_code == 200 and r.json()["status"] == "pausing", r.text
    paused = wait_for(lambda: _settled(client, job["id"], "pausing"), "the pause", timeout=180)
    assert paused["status"] == "paused", cluster.svc.logs()
    k = paused["step"]
    assert 2 <= k < steps - 2, paused
    (point,) = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert point["step"] == k  # both ranks saved at the boundary they stopped at

    # The two devices are free: another 2-device job runs; its cancel stops all its ranks.
    # Submitted while the paused group winds down: the worker takes it only once that ends.
    other_client = cluster.client("group-cancel")
    other = submit_digit_job(other_client, TINY, grpo={**grpo, "steps": 500},
                             checkpoint_every=1000, resources={"devices": 2})  # fmt: skip
    _gone(group, "the paused job's processes to end")
    wait_for(lambda: started(other_client, other["id"], 1), "the second job's step 1", 240)
    other_group = _group_of(other_client, other["id"], 1)
    r = other_client.post(f"/v1/jobs/{other['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelling", r.text
    final = wait_final(other_client, other["id"], timeout=180)
    assert final["status"] == "cancelled" and final["step"] < 500, cluster.svc.logs()
    # Resumed, then the worker shuts down mid-run: the job is handed back, not lost. Resumed
    # while the cancelled group winds down: the worker claims it once that has ended.
    assert client.post(f"/v1/jobs/{job['id']}/resume").json()["status"] == "queued"
    _gone(other_group, "every rank of the cancelled job to end")
    assert other_client.get(f"/v1/jobs/{other['id']}/checkpoints").json()["data"] == []
    assert not [e for e in events(other_client, other["id"]) if e["type"] == "rank_failed"]

    wait_for(lambda: started(client, job["id"], k + 1), "a step after the resume", timeout=240)
    group = _group_of(client, job["id"], 2)
    [worker] = cluster.workers
    worker.send_signal(signal.SIGTERM)
    handed = wait_for(lambda: _settled(client, job["id"], "running"), "the hand-back", 180)
    assert handed["status"] == "queued" and handed["step"] < steps, handed
    saved = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert saved[-1]["step"] == handed["step"]  # checkpointed at the step it handed back
    # The new worker starts (~10 s) while the old one winds down; it can claim the job only
    # now that it is queued, so the hand-back above is the old worker's alone.
    cluster.workers.append(_spawn_worker(cluster, "worker-restarted"))
    assert worker.wait(timeout=180) == 0, cluster.svc.logs()
    cluster.workers.remove(worker)
    _gone(group, "the handed-back job's processes to end")

    final = wait_final(client, job["id"], timeout=300)
    assert final["status"] == "succeeded", cluster.svc.logs()
    assert [c["epoch"] for c in claims(client, job["id"])] == [1, 2, 3]
    resumed = [e["data"] for e in events(client, job["id"]) if e["type"] == "resumed"]
    assert resumed == [{"from_step": k, "redo_steps": 0},
                       {"from_step": handed["step"], "redo_steps": 0}]  # fmt: skip
    handed_back = [e for e in events(client, job["id"]) if "handed the job back" in e["message"]]
    assert len(handed_back) == 1, handed_back
    rows = metric_rows(cluster, job["id"])
    assert [step for step, _ in rows] == list(range(1, steps + 1))  # none lost, none repeated
    assert not [e for e in events(client, job["id"]) if e["type"] == "rank_failed"]


def _settled(client: httpx.Client, job_id: str, passing: str) -> dict[str, Any] | None:
    job = client.get(f"/v1/jobs/{job_id}").json()
    return None if job["status"] == passing else job


def _spawn_worker(cluster: Cluster, name: str) -> subprocess.Popen[bytes]:
    """Another `grpo-service worker --devices 2` on the cluster (as run_cluster starts them)."""
    command = ["worker", "--queue", "gpu", "--grace-seconds", "60", "--devices", "2"]
    proc = _spawn(command, cluster.svc.env, cluster.svc.log_dir / f"{name}.log")
    cluster.svc.procs.append(proc)  # stopped with the cluster
    return proc
