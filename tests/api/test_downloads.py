"""Checkpoint download: streamed (flat memory), HTTP Range, or a 307 to a presigned URL."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Checkpoint
from service.storage import LocalStorage, open_storage_from_settings
from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier, problem
from tests.api.server import settings_of
from tests.e2e.services import RunningService


def seed_checkpoint(
    svc: RunningService, client: httpx.Client, data: bytes | int, **job: Any
) -> tuple[str, str]:
    """A job (`job`: its body's fields) with a checkpoint at step 2, as a worker would leave it;
    data or a size (sparse)."""
    make_verifier(client)
    job = make_job(client, make_dataset(client), **job)
    settings = settings_of(svc)
    storage = open_storage_from_settings(settings)
    key = f"jobs/{job['id']}/checkpoints/step-2.tar"
    if isinstance(data, bytes):
        storage.put_bytes(key, data)
        size, sha = len(data), hashlib.sha256(data).hexdigest()
    else:
        assert isinstance(storage, LocalStorage)
        path = storage.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            fh.truncate(data)
        size, sha = data, "0" * 64
    engine = make_engine(settings.effective_database_url)
    with Session(engine) as s, s.begin():
        s.add(
            Checkpoint(
                id=new_id("ckpt"),
                job_id=job["id"],
                step=2,
                epoch=1,
                object_key=key,
                size_bytes=size,
                sha256=sha,
                format="full",
            )
        )
    engine.dispose()
    return job["id"], sha


def test_download_and_ranges(api: RunningService, client: httpx.Client) -> None:
    data = os.urandom(300_000)
    job_id, sha = seed_checkpoint(api, client, data)
    url = f"/v1/jobs/{job_id}/checkpoints/latest/download"
    full = client.get(url)
    assert full.status_code == 200 and full.content == data
    assert full.headers["accept-ranges"] == "bytes" and full.headers["x-checkpoint-sha256"] == sha
    part = client.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
    tail = client.get(url, headers={"Range": "bytes=-1000"})
    assert tail.status_code == 206 and tail.content == data[-1000:]
    rest = client.get(url, headers={"Range": "bytes=299000-"})
    assert rest.content == data[299000:]
    r = client.get(url, headers={"Range": "bytes=400000-"})
    assert problem(r, 416) and r.headers["content-range"] == f"bytes */{len(data)}"
    assert client.get(url, headers={"Range": "bytes=0-1,5-9"}).status_code == 200  # ignored
    problem(client.get(f"/v1/jobs/{job_id}/checkpoints/7/download"), 404)
    problem(client.get(f"/v1/jobs/{job_id}/checkpoints/x/download"), 422)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_big_download_streams_in_flat_memory(api_http: RunningService) -> None:
    api, client = api_http, tenant_client(api_http)  # the memory measured is the server's
    size = 768 << 20
    job_id, _ = seed_checkpoint(api, client, size)
    pid = api.procs[0].pid
    before, peak, received = _rss_kib(pid), 0, 0
    url = f"/v1/jobs/{job_id}/checkpoints/2/download"
    with client.stream("GET", url) as r:
        assert r.status_code == 200 and int(r.headers["content-length"]) == size
        for chunk in r.iter_raw(1 << 20):
            received += len(chunk)
            if received % (64 << 20) < len(chunk):
                peak = max(peak, _rss_kib(pid))
    assert received == size
    assert peak - before < 100 * 1024, f"API RSS grew {(peak - before) >> 10} MiB"


def test_s3_download_redirects_to_a_presigned_url(api_pg: RunningService) -> None:
    client = api_pg.client(api_pg.new_key("downloads"))
    data = os.urandom(10_000)
    job_id, _ = seed_checkpoint(api_pg, client, data)
    r = client.get(f"/v1/jobs/{job_id}/checkpoints/2/download")
    assert r.status_code == 307, r.text
    location = r.headers["location"]
    assert "Signature" in location or "X-Amz-Signature" in location
    assert httpx.get(location).content == data  # no API key needed: the URL is the grant
    other = api_pg.client(api_pg.new_key("downloads-other"))
    problem(other.get(f"/v1/jobs/{job_id}/checkpoints/2/download"), 404)
