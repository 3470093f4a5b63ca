"""Retries, Retry-After and idempotency keys, and downloads from a server without Range
support: against a scripted HTTP server, since the real one cannot be made to do these."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from grpo_client import ApiError, ChecksumMismatch, Client
from tests.client.flaky_server import Script, as_json, scripted_server

VERIFIER = {
    "id": "ver_1", "name": "v", "version": 1, "kind": "python", "description": "",
    "config": {}, "sha256": "0" * 64, "created_at": "2026-01-01T00:00:00Z",
}  # fmt: skip


def test_503_and_429_are_retried_with_one_idempotency_key() -> None:
    script = Script(
        {
            "/v1/verifiers": [
                as_json(503, {"status": 503, "title": "Unavailable"}, **{"Retry-After": "0"}),
                as_json(429, {"status": 429, "title": "Too Many"}, **{"Retry-After": "1"}),
                as_json(201, VERIFIER),
            ]
        }
    )
    with scripted_server(script) as url, Client(url, "key", backoff=0.01) as grpo:
        started = time.monotonic()
        assert grpo.verifiers.create("v", "python", {"source": "x"}).id == "ver_1"
        assert time.monotonic() - started >= 0.9  # Retry-After: 1 honoured
    keys = {r["headers"]["Idempotency-Key"] for r in script.seen}
    assert len(script.seen) == 3 and len(keys) == 1 and keys != {""}


def test_gives_up_after_max_retries_with_the_problem() -> None:
    problem = {"status": 503, "title": "Service Unavailable", "detail": "draining"}
    script = Script({"/v1/jobs": [as_json(503, problem)]})
    with (
        scripted_server(script) as url,
        Client(url, "k", max_retries=2, backoff=0.01) as grpo,
        pytest.raises(ApiError) as err,
    ):
        grpo.jobs.list()
    assert len(script.seen) == 3 and err.value.problem == problem
    assert str(err.value) == "503 Service Unavailable: draining"


def test_download_from_a_server_without_ranges_starts_over(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 400
    listing = {
        "data": [
            {
                "id": "ckpt_1", "step": 5, "size_bytes": len(blob), "format": "full",
                "sha256": hashlib.sha256(blob).hexdigest(), "created_at": "2026-01-01T00:00:00Z",
            }
        ]
    }  # fmt: skip
    script = Script(
        {
            "/v1/jobs/job_1/checkpoints": [as_json(200, listing)],
            "/v1/jobs/job_1/checkpoints/5/download": [(200, {}, blob)],
        }
    )
    dest = tmp_path / "c.tar"
    Path(str(dest) + ".part").write_bytes(blob[:1000])
    with scripted_server(script) as url, Client(url, "k") as grpo:
        assert grpo.checkpoints.download("job_1", "latest", dest).read_bytes() == blob
        assert script.seen[-1]["headers"]["Range"] == "bytes=1000-"

        script.answers["/v1/jobs/job_1/checkpoints/5/download"] = [(200, {}, blob[::-1])]
        with pytest.raises(ChecksumMismatch):
            grpo.checkpoints.download("job_1", 5, tmp_path / "bad.tar")
    assert not (tmp_path / "bad.tar").exists() and not (tmp_path / "bad.tar.part").exists()


def test_wait_falls_back_to_polling_without_sse() -> None:
    job = {
        "id": "job_1", "status": "succeeded", "spec": {}, "step": 2, "total_steps": 2,
        "latest_metrics": None, "error": None, "created_at": "2026-01-01T00:00:00Z",
        "started_at": None, "finished_at": None,
    }  # fmt: skip
    event = {"id": 7, "at": "2026-01-01T00:00:00Z", "type": "status", "message": "done", "data": {}}
    script = Script(
        {
            "/v1/jobs/job_1/events": [as_json(200, {"data": [event]})],  # JSON, never a stream
            "/v1/jobs/job_1": [as_json(200, job)],
        }
    )
    seen = []
    with scripted_server(script) as url, Client(url, "k") as grpo:
        final = grpo.jobs.wait("job_1", on_event=seen.append, poll_interval=0.01)
    assert final.status == "succeeded" and [e.id for e in seen] == [7]
    asked = [r["headers"].get("Accept") for r in script.seen if r["path"].endswith("/events")]
    assert asked[0] == "text/event-stream"  # tried the stream first
