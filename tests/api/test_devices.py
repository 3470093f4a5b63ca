"""`resources.devices` at submission: the batch must split into whole groups across the
devices, and a queue's live workers must own as many (their heartbeat rows hold the count);
a queue no live worker serves accepts any count, with the `no_worker` warning as before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import create_engine, delete
from sqlalchemy.orm import Session

from service.models import WorkerHeartbeat
from service.models.base import utcnow
from service.queues.worker_registry import LIVENESS_MEMO_S
from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, job_body, make_dataset, make_verifier, problem
from tests.api.server import IDLE_QUEUE
from tests.e2e.services import RunningService

WORKER = "devices-test-host:1"


def _submit(client: httpx.Client, dataset: str, devices: int, prompts: int = 4) -> httpx.Response:
    grpo = {"steps": 2, "prompts_per_step": prompts, "group_size": 2}
    return client.post(
        "/v1/jobs", json=job_body(dataset, grpo=grpo, resources={"devices": devices})
    )


@pytest.fixture
def two_device_worker(api: RunningService) -> Iterator[None]:
    with _live_worker(api):
        yield


@contextmanager
def _live_worker(api: RunningService) -> Iterator[None]:
    """A live heartbeat row of a worker owning 2 devices on IDLE_QUEUE (as `grpo-service
    worker --devices 2 --queue ...` writes it), removed on the way out."""
    engine = create_engine(f"sqlite:///{api.env['GRPO_DATA_DIR']}/grpo.db")
    now = utcnow()
    with Session(engine) as session, session.begin():
        row = WorkerHeartbeat(worker_id=WORKER, queue=IDLE_QUEUE, hostname="devices-test", pid=1)
        session.add(row)
        row.devices, row.started_at, row.last_seen_at = 2, now, now
    try:
        yield
    finally:
        with Session(engine) as session, session.begin():
            session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.worker_id == WORKER))
        engine.dispose()
        time.sleep(LIVENESS_MEMO_S)  # the API remembers a served queue that long


def test_devices_that_do_not_split_the_batch_are_refused(api: RunningService) -> None:
    client = tenant_client(api)
    make_verifier(client)
    dataset = make_dataset(client)
    body = problem(_submit(client, dataset, devices=3), 422)
    [error] = body["errors"]
    assert error["path"] == "$.resources.devices"
    assert "do not split into whole groups across 3 processes" in error["message"]
    body = problem(_submit(client, dataset, devices=8), 422)
    assert "resources.devices 8 is more than the step's 4 groups" in body["errors"][0]["message"]
    for bad in (0, 65):  # bounded by the schema
        assert error_paths(_submit(client, dataset, devices=bad)) == ["$.resources.devices"]


def test_a_queue_without_live_workers_accepts_any_count(api: RunningService) -> None:
    client = tenant_client(api)
    make_verifier(client)
    r = _submit(client, make_dataset(client), devices=4)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["resources"] == {"devices": 4, "rollout_devices": 0}
    types = [e["type"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()["data"]]
    assert "no_worker" in types
    client.post(f"/v1/jobs/{job['id']}/cancel")


def test_more_devices_than_the_live_workers_own_is_a_422(
    api: RunningService, two_device_worker: None
) -> None:
    client = tenant_client(api)
    make_verifier(client)
    dataset = make_dataset(client)
    body = problem(_submit(client, dataset, devices=4), 422)
    [error] = body["errors"]
    assert error["path"] == "$.resources.devices"
    assert f"live workers of queue '{IDLE_QUEUE}' own at most 2" in error["message"]
    r = _submit(client, dataset, devices=2)  # fits: accepted, and no warning
    assert r.status_code == 201, r.text
    job = r.json()
    types = [e["type"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()["data"]]
    assert "no_worker" not in types
    client.post(f"/v1/jobs/{job['id']}/cancel")


def _warned(client: httpx.Client, dataset: str) -> bool:
    r = _submit(client, dataset, devices=1)
    assert r.status_code == 201, r.text
    job = r.json()
    types = [e["type"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()["data"]]
    client.post(f"/v1/jobs/{job['id']}/cancel")
    return "no_worker" in types


def test_a_worker_that_has_just_started_silences_the_warning_at_once(api: RunningService) -> None:
    """The API remembers a served queue for a second, never an unserved one: the submission
    right after a worker's first heartbeat gets no `no_worker` warning."""
    client = tenant_client(api)
    make_verifier(client)
    dataset = make_dataset(client)
    assert _warned(client, dataset)
    with _live_worker(api):
        assert not _warned(client, dataset)


def test_rollout_devices_need_rollouts_ahead_and_one_training_device(api: RunningService) -> None:
    client = tenant_client(api)
    make_verifier(client)
    dataset = make_dataset(client)

    def submit(resources: dict, k: int) -> httpx.Response:
        grpo = {"steps": 2, "prompts_per_step": 4, "group_size": 2, "max_off_policy_steps": k}
        return client.post("/v1/jobs", json=job_body(dataset, grpo=grpo, resources=resources))

    body = problem(submit({"devices": 2, "rollout_devices": 1}, k=0), 422)
    assert body["errors"][0]["path"] == "$.resources.rollout_devices"
    assert "grpo.max_off_policy_steps to 1 or more" in body["errors"][0]["message"]
    body = problem(submit({"devices": 3, "rollout_devices": 1}, k=1), 422)
    assert body["errors"][0]["path"] == "$.resources.devices"
    assert "must be rollout_devices + 1 = 2, not 3" in body["errors"][0]["message"]
    assert error_paths(submit({"devices": 3, "rollout_devices": 2}, k=1)) == [
        "$.resources.rollout_devices"
    ]  # one rollout device at most
    # without rollout devices, rollouts made ahead still run on one process
    body = problem(submit({"devices": 2}, k=1), 422)
    assert (
        "max_off_policy_steps (rollouts generated ahead) runs on one process"
        in (body["errors"][0]["message"])
    )
    accepted = submit({"devices": 2, "rollout_devices": 1}, k=1)  # no live worker: any count
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["resources"] == {"devices": 2, "rollout_devices": 1}
    client.post(f"/v1/jobs/{accepted.json()['id']}/cancel")
