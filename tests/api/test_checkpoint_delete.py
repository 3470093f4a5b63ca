"""`DELETE /v1/jobs/{id}/checkpoints/{step}`: the row, then the archive; 404 as for a missing
one across tenants; 409 while a live job resumes or starts from the checkpoint."""

from __future__ import annotations

import hashlib

import httpx
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Checkpoint
from service.storage import open_storage_from_settings
from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier, problem
from tests.api.server import settings_of
from tests.e2e.services import RunningService


def add_checkpoint(svc: RunningService, job_id: str, step: int) -> str:
    """A stored checkpoint of the job at `step`, as a worker leaves it; returns its key."""
    settings = settings_of(svc)
    data = f"{job_id}@{step}".encode()
    key = f"tenants/t/jobs/{job_id}/e1/step-{step}.tar"
    open_storage_from_settings(settings).put_bytes(key, data)
    engine = make_engine(settings.effective_database_url)
    with Session(engine) as s, s.begin():
        s.add(
            Checkpoint(
                id=new_id("ckpt"), job_id=job_id, step=step, epoch=1, object_key=key,
                size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), format="full",
            )
        )  # fmt: skip
    engine.dispose()
    return key


def live_job(svc: RunningService, client: httpx.Client, steps: list[int]) -> tuple[str, list[str]]:
    """A queued job (live: nobody consumes its queue) with checkpoints at `steps`."""
    make_verifier(client)
    job = make_job(client, make_dataset(client))
    return job["id"], [add_checkpoint(svc, job["id"], step) for step in steps]


def listed(client: httpx.Client, job_id: str) -> list[int]:
    r = client.get(f"/v1/jobs/{job_id}/checkpoints")
    assert r.status_code == 200, r.text
    return [c["step"] for c in r.json()["data"]]


def test_delete_removes_the_row_then_the_object(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    job_id, keys = live_job(any_api, client, [1, 2])
    storage = open_storage_from_settings(settings_of(any_api))
    r = client.delete(f"/v1/jobs/{job_id}/checkpoints/1")
    assert r.status_code == 204 and r.content == b"", r.text
    assert listed(client, job_id) == [2]
    problem(client.get(f"/v1/jobs/{job_id}/checkpoints/1/download"), 404)
    assert not storage.exists(keys[0]) and storage.exists(keys[1])
    problem(client.delete(f"/v1/jobs/{job_id}/checkpoints/1"), 404)  # gone
    events = client.get(f"/v1/jobs/{job_id}/events").json()["data"]
    assert [e["data"] for e in events if e["type"] == "checkpoint_deleted"] == [{"step": 1}]


def test_a_live_jobs_latest_checkpoint_is_kept_until_the_job_ends(
    any_api: RunningService,
) -> None:
    client = tenant_client(any_api)
    job_id, keys = live_job(any_api, client, [1, 2])
    for step in ("2", "latest"):
        body = problem(client.delete(f"/v1/jobs/{job_id}/checkpoints/{step}"), 409)
        assert "latest of live job" in body["detail"]
    assert listed(client, job_id) == [1, 2]
    assert client.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert client.delete(f"/v1/jobs/{job_id}/checkpoints/latest").status_code == 204
    assert listed(client, job_id) == [1]
    assert not open_storage_from_settings(settings_of(any_api)).exists(keys[1])


def test_a_checkpoint_a_live_job_starts_from_is_kept(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    job_id, _ = live_job(any_api, client, [1, 2])
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    base = next(c for c in client.get(f"/v1/jobs/{job_id}/checkpoints").json()["data"])
    child = make_job(client, client.get(f"/v1/jobs/{job_id}").json()["spec"]["dataset"],
                     base_model=base["id"])  # fmt: skip
    body = problem(client.delete(f"/v1/jobs/{job_id}/checkpoints/1"), 409)
    assert "base of a live job" in body["detail"]
    assert client.post(f"/v1/jobs/{child['id']}/cancel").status_code == 202
    assert client.delete(f"/v1/jobs/{job_id}/checkpoints/1").status_code == 204


def test_another_tenants_checkpoint_answers_like_a_missing_one(any_api: RunningService) -> None:
    owner, stranger = tenant_client(any_api), tenant_client(any_api)
    job_id, _ = live_job(any_api, owner, [1, 2])
    theirs = problem(stranger.delete(f"/v1/jobs/{job_id}/checkpoints/1"), 404)
    absent = problem(stranger.delete("/v1/jobs/job_0000000000000000000000/checkpoints/1"), 404)
    assert theirs["title"] == absent["title"] and theirs["type"] == absent["type"]
    assert listed(owner, job_id) == [1, 2]
    problem(owner.delete(f"/v1/jobs/{job_id}/checkpoints/7"), 404)
    problem(owner.delete(f"/v1/jobs/{job_id}/checkpoints/one"), 422)
