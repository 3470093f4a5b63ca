"""Fault injection on real processes: jobs are never lost and never run twice in effect."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import make_url

from tests.e2e.cluster import Cluster, PrivatePostgres, run_cluster
from tests.e2e.freezing import frozen
from tests.e2e.services import TINY, free_port
from tests.e2e.test_training_flow import submit_digit_job, wait_final

LONG_JOB = {
    "grpo": {"steps": 12, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
    "checkpoint_every": 3,
}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, moto_server: str, tiny_model_dir: Path
) -> Iterator[Cluster]:
    with run_cluster(tmp_path_factory.mktemp("cluster"), moto_server, model=tiny_model_dir) as c:
        yield c


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def events(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return client.get(f"/v1/jobs/{job_id}/events").json()["data"]


def claims(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events(client, job_id) if e["data"].get("status") == "running"]


def trainer_pid(client: httpx.Client, job_id: str, epoch: int) -> int:
    claim = next(c for c in claims(client, job_id) if c["epoch"] == epoch)
    return int(claim["worker"].rsplit(":", 1)[1])


def metric_rows(cluster: Cluster, job_id: str) -> list[tuple[int, int]]:
    """(step, epoch) of every stored metric row, read straight from PostgreSQL."""
    url = make_url(cluster.svc.env["GRPO_DATABASE_URL"])
    out = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(url.port or 5432), "-U", "postgres",
         "-d", str(url.database), "-tAc",
         f"SELECT step, epoch FROM job_metrics WHERE job_id = '{job_id}' ORDER BY step"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return [tuple(map(int, line.split("|"))) for line in out.split()]  # type: ignore[misc]


def started(client: httpx.Client, job_id: str, step: int) -> bool:
    return client.get(f"/v1/jobs/{job_id}").json()["step"] >= step


def test_killed_trainer_is_resumed_from_its_checkpoint(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    client = cluster.client("kill")
    job = submit_digit_job(client, TINY, **LONG_JOB)
    wait_for(lambda: started(client, job["id"], 4), "step 4")
    os.kill(trainer_pid(client, job["id"], 1), signal.SIGKILL)  # an OOM kill, say

    final = wait_final(client, job["id"], timeout=240)
    assert final["status"] == "succeeded", cluster.svc.logs()
    assert [c["epoch"] for c in claims(client, job["id"])] == [1, 2]
    rows = metric_rows(cluster, job["id"])
    assert [step for step, _ in rows] == list(range(1, 13))  # every step exactly once
    resumed_at = min(step for step, epoch in rows if epoch == 2)
    assert resumed_at - 1 in (3, 6, 9) and resumed_at >= 4  # from a committed checkpoint
    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert [c["step"] for c in ckpts] == [3, 6, 9, 12]


def test_stopped_zombie_past_its_lease_writes_nothing(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    client = cluster.client("zombie")
    job = submit_digit_job(client, TINY, **LONG_JOB)
    wait_for(lambda: started(client, job["id"], 2), "step 2")
    zombie = trainer_pid(client, job["id"], 1)  # the watchdog that claimed it
    with frozen(zombie) as stopped:  # it and its training process, as on a paused host
        assert len(stopped) >= 2, stopped
        wait_for(lambda: len(claims(client, job["id"])) == 2, "the takeover", timeout=60)
        new_epoch_steps = lambda: any(e == 2 for _, e in metric_rows(cluster, job["id"]))  # noqa: E731
        wait_for(new_epoch_steps, "a step of the new run")
    final = wait_final(client, job["id"], timeout=240)
    assert final["status"] == "succeeded", cluster.svc.logs()
    rows = metric_rows(cluster, job["id"])
    assert [step for step, _ in rows] == list(range(1, 13))
    first_new = min(step for step, epoch in rows if epoch == 2)
    assert all(epoch == 2 for step, epoch in rows if step >= first_new), rows  # zombie fenced
    for pid in stopped:  # the training process is killed, the watchdog idles in the pool
        wait_for(lambda: not _alive_in_task(pid), "the zombie to stop training", timeout=60)  # noqa: B023


def _alive_in_task(pid: int) -> bool:
    """The zombie's process may live on as an idle pool child, but its CPU use stops."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            before = sum(int(x) for x in fh.read().split()[13:15])
        time.sleep(1.0)
        with open(f"/proc/{pid}/stat") as fh:
            after = sum(int(x) for x in fh.read().split()[13:15])
    except (FileNotFoundError, ProcessLookupError):  # gone (the latter: between open and read)
        return False
    return after - before > 50  # more than half a CPU-second per second: still training


def test_cancel_when_the_worker_is_dead(cluster: Cluster, tiny_model_dir: Path) -> None:
    client = cluster.client("cancel-dead")
    job = submit_digit_job(client, TINY, **LONG_JOB)
    wait_for(lambda: started(client, job["id"], 1), "step 1")
    with frozen(trainer_pid(client, job["id"], 1)):  # its watchdog and training process
        assert client.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelling"
        final = wait_final(client, job["id"], timeout=60)
    assert final["status"] == "cancelled"
    assert len(claims(client, job["id"])) == 1  # nobody trained it again


def test_jobs_submitted_while_redis_is_down_still_run(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    client = cluster.client("redis-down")
    cluster.redis.kill()
    api_log = cluster.svc.log_dir / "api.log"
    try:
        job = submit_digit_job(client, TINY)  # 201: the row is the truth
        # Its wake-up was published while Redis was down, and lost (the API gave up on it).
        gave_up = f"could not enqueue job {job['id']}"
        wait_for(lambda: gave_up in api_log.read_text(errors="replace"), "the lost wake-up", 30)
    finally:
        cluster.redis.start()  # a fresh, empty Redis: every message is gone
    final = wait_final(client, job["id"], timeout=180)
    assert final["status"] == "succeeded", cluster.svc.logs()
    assert any(e["type"] == "requeued" for e in events(client, job["id"]))


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def test_sigterm_hands_the_job_over_without_losing_a_step(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    client = cluster.client("graceful")
    job = submit_digit_job(client, TINY, **LONG_JOB)
    wait_for(lambda: started(client, job["id"], 1), "step 1")
    trainer = trainer_pid(client, job["id"], 1)
    supervisors, pid = {p.pid for p in cluster.workers}, trainer
    while pid not in supervisors:  # pool child -> celery -> group leader -> grpo-service worker
        pid = _parent(pid)
    worker = next(p for p in cluster.workers if p.pid == pid)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=120) == 0
    cluster.workers.remove(worker)

    final = wait_final(client, job["id"], timeout=240)
    assert final["status"] == "succeeded", cluster.svc.logs()
    resumed = [e["data"] for e in events(client, job["id"]) if e["type"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["redo_steps"] == 0, resumed  # nothing redone
    handed_back = [e for e in events(client, job["id"]) if "handed the job back" in e["message"]]
    assert len(handed_back) == 1
    assert [step for step, _ in metric_rows(cluster, job["id"])] == list(range(1, 13))


def test_survives_a_postgresql_restart(
    tmp_path: Path, moto_server: str, tiny_model_dir: Path
) -> None:
    """On a PostgreSQL server of its own: the other tests go on using the shared one."""
    postgres = PrivatePostgres(free_port())
    postgres.start()
    try:
        with run_cluster(tmp_path / "cluster", moto_server, model=tiny_model_dir,
                         database_url=postgres.url) as cluster:  # fmt: skip
            client = cluster.client("pg-restart")
            job = submit_digit_job(client, TINY, **LONG_JOB)
            wait_for(lambda: started(client, job["id"], 2), "step 2")
            postgres.restart()
            started_at = time.monotonic()
            r = httpx.get(f"{cluster.svc.base_url}/readyz", timeout=30)  # answers; never hangs
            assert r.status_code in (200, 503) and time.monotonic() - started_at < 30
            wait_for(lambda: httpx.get(f"{cluster.svc.base_url}/readyz").is_success, "readyz")
            final = wait_final(client, job["id"], timeout=240)
            assert final["status"] == "succeeded", cluster.svc.logs()
            assert [step for step, _ in metric_rows(cluster, job["id"])] == list(range(1, 13))
    finally:
        postgres.stop()
