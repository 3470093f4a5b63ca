"""Workers register the queues they serve, and a job sent to a declared queue that no live
worker serves gets a `no_worker` warning event at submission (before, it stayed queued
forever without a word). With real processes: the API, and a `grpo-service worker` whose
registration appears, suppresses the warning, and goes stale once the worker is SIGKILLed."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.api.server import IDLE_QUEUE, LIMITS, serve_in_process
from tests.e2e.services import RunningService, _spawn

SERVED = "served"
HEARTBEAT_S = 1.0  # a worker is live for 3 heartbeats after its last one


def _types(client: httpx.Client, job: dict[str, Any]) -> list[str]:
    return [e["type"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()["data"]]


def test_a_queue_with_no_live_worker_gets_a_warning(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    make_verifier(client)
    job = make_job(client, make_dataset(client), queue=IDLE_QUEUE)
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    warning = next(e for e in events if e["type"] == "no_worker")
    assert warning["data"] == {"queue": IDLE_QUEUE}
    assert f"no live worker serves queue '{IDLE_QUEUE}'" in warning["message"]
    assert job["status"] == "queued"  # accepted all the same: a worker may be on its way


def _registered(svc: RunningService) -> list[tuple[str, str]]:
    engine = create_engine(f"sqlite:///{svc.env['GRPO_DATA_DIR']}/grpo.db")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT worker_id, queue FROM worker_heartbeats")).all()
    engine.dispose()
    return [tuple(r) for r in rows]


def test_a_live_worker_suppresses_the_warning_until_it_dies(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    queues = {**json.loads(LIMITS["GRPO_QUEUES"]), SERVED: {}}
    env = {"GRPO_QUEUES": json.dumps(queues), "GRPO_HEARTBEAT_SECONDS": str(HEARTBEAT_S)}
    with serve_in_process(env, tmp_path, tiny_model_dir) as svc:
        client = tenant_client(svc)
        make_verifier(client)
        dataset = make_dataset(client)
        worker = _spawn(["worker", "--queue", SERVED], svc.env, tmp_path / "worker.log")
        try:
            deadline = time.monotonic() + 60
            while not _registered(svc):
                assert worker.poll() is None and time.monotonic() < deadline, svc.logs()
                time.sleep(0.2)
            [(worker_id, queue)] = _registered(svc)
            assert queue == SERVED and worker_id.endswith(f":{worker.pid}")

            served = make_job(client, dataset, queue=SERVED)
            client.post(f"/v1/jobs/{served['id']}/cancel")  # nothing to train: only the warning
            assert "no_worker" not in _types(client, served)
            assert "no_worker" in _types(client, make_job(client, dataset, queue=IDLE_QUEUE))

            worker.send_signal(signal.SIGKILL)  # no goodbye: its row stays, and goes stale
            worker.wait(timeout=30)
            time.sleep(3 * HEARTBEAT_S + 0.5)
            assert _registered(svc) == [(worker_id, SERVED)]
            assert "no_worker" in _types(client, make_job(client, dataset, queue=SERVED))
        finally:
            if worker.poll() is None:
                worker.kill()
