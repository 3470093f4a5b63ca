"""Chaos run: jobs on two workers while a driver kills and stops trainers and restarts Redis.

Prints jobs submitted / succeeded / lost, overlapping live epochs, duplicate metric rows,
whether checkpoint steps only moved forward, work redone after a fault (steps) and recovery
time (fault -> next claim) p50/p95. Real PostgreSQL, a private Redis, S3 on moto, real
worker processes. Usage: python bench/chaos.py [--jobs 12] [--seconds 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.cluster import Cluster, run_cluster  # noqa: E402
from tests.e2e.freezing import frozen  # noqa: E402
from tests.e2e.services import TINY  # noqa: E402
from tests.e2e.test_training_flow import submit_digit_job  # noqa: E402

JOB = {
    "grpo": {"steps": 9, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
    "checkpoint_every": 3,
}


def sql(cluster: Cluster, query: str) -> list[list[str]]:
    db = cluster.svc.env["GRPO_DATABASE_URL"].rsplit("/", 1)[1]
    out = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-tAc", query],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line.split("|") for line in out.splitlines() if line]


def running_trainers(cluster: Cluster) -> list[int]:
    rows = sql(
        cluster,
        "SELECT e.data->>'worker' FROM job_events e JOIN jobs j ON j.id = e.job_id "
        "WHERE j.status = 'running' AND e.data->>'status' = 'running' "
        "AND (e.data->>'epoch')::int = j.epoch",
    )
    return [int(r[0].rsplit(":", 1)[1]) for r in rows if r[0]]


def fault(cluster: Cluster, rng: random.Random, log: list[dict[str, Any]]) -> None:
    action = rng.choice(["kill", "kill", "stop", "redis"])
    pids = running_trainers(cluster)
    if action in ("kill", "stop") and not pids:
        return
    at = time.time()
    try:
        if action == "kill":
            os.kill(rng.choice(pids), signal.SIGKILL)
        elif action == "stop":
            with frozen(rng.choice(pids)):  # its watchdog and training process
                time.sleep(8)  # past the 5 s lease
    except ProcessLookupError:  # that run finished meanwhile
        return
    if action == "redis":
        cluster.redis.kill()
        time.sleep(2)
        cluster.redis.start()
    log.append({"action": action, "at": at})
    print(f"  fault: {action}", flush=True)


def live(cluster: Cluster) -> bool:
    query = "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'cancelling')"
    return sql(cluster, query)[0][0] != "0"


def report(cluster: Cluster, job_ids: list[str], faults: list[dict[str, Any]]) -> None:
    ids = ",".join(f"'{j}'" for j in job_ids)
    status = dict(sql(cluster, f"SELECT status, count(*) FROM jobs WHERE id IN ({ids}) GROUP BY 1"))
    dup = sql(
        cluster,
        f"SELECT count(*) FROM (SELECT job_id, step FROM job_metrics "
        f"WHERE job_id IN ({ids}) GROUP BY 1, 2 HAVING count(*) > 1) d",
    )[0][0]
    # a metric row of epoch e stored after epoch e+1 was claimed would be a zombie write
    overlap = sql(
        cluster,
        f"""
        SELECT count(*) FROM checkpoints c JOIN job_events e ON e.job_id = c.job_id
        WHERE c.job_id IN ({ids}) AND e.data->>'status' = 'running'
          AND (e.data->>'epoch')::int > c.epoch AND c.created_at > e.at""",
    )[0][0]
    ckpts = sql(
        cluster,
        f"SELECT job_id, step FROM checkpoints WHERE job_id IN ({ids}) ORDER BY job_id, created_at",
    )
    monotonic = all(
        int(b[1]) > int(a[1]) for a, b in zip(ckpts, ckpts[1:], strict=False) if a[0] == b[0]
    )
    redo = [
        int(r[0])
        for r in sql(
            cluster,
            f"SELECT data->>'redo_steps' FROM job_events "
            f"WHERE type = 'resumed' AND job_id IN ({ids})",
        )
    ]
    claims = sorted(
        float(r[0])
        for r in sql(
            cluster,
            f"SELECT extract(epoch FROM at) FROM job_events "
            f"WHERE data->>'status' = 'running' AND job_id IN ({ids})",
        )
    )
    recovery = []
    for f in faults:
        later = [c - f["at"] for c in claims if c > f["at"]]
        if f["action"] != "redis" and later:
            recovery.append(min(later))
    succeeded = int(status.get("succeeded", 0))
    # lost: neither finished nor still owned after the fault-free drain
    lost = len(job_ids) - sum(int(v) for k, v in status.items() if k in ("succeeded", "failed"))
    print(f"jobs submitted          {len(job_ids)}")
    print(f"succeeded               {succeeded}  (statuses: {status})")
    print(f"lost                    {lost}")
    print(
        f"faults injected         {len(faults)}: "
        f"{ {a: sum(f['action'] == a for f in faults) for a in ('kill', 'stop', 'redis')} }"
    )
    print(f"overlapping live epochs {overlap}")
    print(f"duplicate metric rows   {dup}")
    print(f"checkpoint steps monotonic: {'yes' if monotonic else 'NO'}")
    if redo:
        print(f"work redone (steps)     median {statistics.median(redo)}  worst {max(redo)}")
    if recovery:
        q = statistics.quantiles(recovery, n=20) if len(recovery) > 1 else recovery * 19
        print(f"recovery s (fault->claim) p50 {statistics.median(recovery):.1f}  p95 {q[18]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain", type=float, default=300, help="fault-free wait at the end")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from workers.grpo.tiny_model import make_tiny_model

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "model")
        cluster_dir, s3 = Path(tmp) / "cluster", f"http://{host}:{port}"
        # many faults per job by design: allow more claims than production's default
        with run_cluster(
            cluster_dir, s3, extra_env={"GRPO_MAX_ATTEMPTS": "20"}, model=model
        ) as cluster:
            # a tenant per job: each registers its own "digits" verifier version 1
            job_ids = [
                submit_digit_job(cluster.client(f"chaos-{i}"), TINY, **JOB)["id"]
                for i in range(args.jobs)
            ]
            print(f"submitted {len(job_ids)} jobs; injecting faults", flush=True)
            faults: list[dict[str, Any]] = []
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline and live(cluster):
                time.sleep(rng.uniform(5, 12))
                fault(cluster, rng, faults)
            print("faults stopped; waiting for the jobs to settle", flush=True)
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline and live(cluster):
                time.sleep(1)
            report(cluster, job_ids, faults)
    moto.stop()


if __name__ == "__main__":
    main()
