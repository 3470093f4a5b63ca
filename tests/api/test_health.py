"""Probes and Prometheus metrics."""

from __future__ import annotations

from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.api.server import METRICS_TOKEN
from tests.e2e.services import RunningService


def test_readyz_reports_each_dependency(any_api: RunningService) -> None:
    r = any_api.client(None).get("/readyz")
    assert r.status_code == 200
    assert r.json()["checks"] == {"database": "ok", "broker": "ok", "storage": "ok"}
    assert r.json()["verifier_sandbox"] == "bubblewrap"  # CI installs bubblewrap
    assert "cgroup" in r.json()["verifier_sandbox_memory"]  # which one holds it, or why none
    assert any_api.client(None).get("/healthz").json() == {"status": "ok"}


def test_metrics_by_route_jobs_by_status_and_queue_depth(
    any_api: RunningService,
) -> None:
    client = any_api.client(any_api.new_key("metrics"))
    make_verifier(client)
    job = make_job(client, make_dataset(client))
    operator = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    polls = 'grpo_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"}'
    timed = 'grpo_http_request_seconds_count{method="GET",route="/v1/jobs/{job_id}"}'
    before = _values(any_api.client(None).get("/metrics", headers=operator).text)
    for _ in range(3):
        client.get(f"/v1/jobs/{job['id']}")
    text = any_api.client(None).get("/metrics", headers=operator).text
    after = _values(text)
    # Counted by this app (the test process may host another app: its counts do not move here)
    assert after[polls] - before.get(polls, 0.0) == 3
    assert after[timed] - before.get(timed, 0.0) == 3
    queued = next(
        line for line in text.splitlines() if line.startswith('grpo_jobs{status="queued"}')
    )
    assert float(queued.split()[-1]) >= 1
    depth = next(
        line
        for line in text.splitlines()
        if line.startswith('grpo_queue_depth{queue="nobody-listens"}')
    )
    assert float(depth.split()[-1]) >= 1


def _values(text: str) -> dict[str, float]:
    """The samples of a Prometheus text exposition, by series."""
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    return {series: float(value) for series, value in pairs}
