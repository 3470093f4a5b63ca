"""Probes and Prometheus metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

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
    route = {"method": "GET", "route": "/v1/jobs/{job_id}"}
    polls = ("grpo_http_requests_total", {**route, "status": "200"})
    timed = ("grpo_http_request_seconds_count", route)
    before = any_api.client(None).get("/metrics", headers=operator).text
    for _ in range(3):
        client.get(f"/v1/jobs/{job['id']}")
    text = any_api.client(None).get("/metrics", headers=operator).text
    # Counted by this app (the test process may host another app: its counts do not move here)
    assert _sample(text, *polls) - _sample(before, *polls) == 3
    assert _sample(text, *timed) - _sample(before, *timed) == 3
    assert _sample(text, "grpo_jobs", {"status": "queued"}) >= 1
    assert _sample(text, "grpo_queue_depth", {"queue": "nobody-listens"}) >= 1


def _sample(text: str, name: str, labels: dict[str, str]) -> float:
    """A sample's value in a Prometheus text exposition (0 when it is not there)."""
    samples = (s for family in text_string_to_metric_families(text) for s in family.samples)
    return next((s.value for s in samples if s.name == name and s.labels == labels), 0.0)
