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
    client.get(f"/v1/jobs/{job['id']}")
    operator = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    text = any_api.client(None).get("/metrics", headers=operator).text
    assert 'grpo_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"}' in text
    assert (
        'grpo_http_request_seconds_bucket{le="0.05",method="GET",route="/v1/jobs/{job_id}"}' in text
    )
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
