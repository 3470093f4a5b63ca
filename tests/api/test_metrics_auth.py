"""`/metrics` shows tenants' queue names and job counts to the operator only: with
GRPO_METRICS_TOKEN set (as in the API tests) a scrape without that bearer token is a 401;
with none set, the open /metrics holds the request metrics and no job or queue gauge. Before,
anyone could read `grpo_jobs{status}` and `grpo_queue_depth{queue="…"}` unauthenticated."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier, problem
from tests.api.server import IDLE_QUEUE, METRICS_TOKEN, run_api
from tests.e2e.services import RunningService

OPERATOR_ONLY = ("grpo_jobs", "grpo_queue_depth")


def test_metrics_need_the_operator_token(any_api: RunningService) -> None:
    metrics = any_api.client(None)
    client = tenant_client(any_api)
    tenant_key = client.headers["authorization"]
    for headers in ({}, {"Authorization": tenant_key}, {"Authorization": "Bearer wrong"}):
        r = metrics.get("/metrics", headers=headers)
        body = problem(r, 401)
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "GRPO_METRICS_TOKEN" in body["detail"] and IDLE_QUEUE not in r.text
    r = metrics.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert all(name in r.text for name in OPERATOR_ONLY)


def test_without_a_token_metrics_hold_no_tenant_activity(tmp_path: Path) -> None:
    # A server process: what its /metrics shows is all that process holds (the test process
    # holds the metrics of every module it imported).
    with run_api({"GRPO_METRICS_TOKEN": ""}, tmp_path) as svc:
        client = tenant_client(svc)
        client.get("/v1/jobs")
        r = httpx.get(f"{svc.base_url}/metrics")
        assert r.status_code == 200
        assert 'grpo_http_requests_total{method="GET",route="/v1/jobs",status="200"}' in r.text
        lines = [line for line in r.text.splitlines() if not line.startswith("#")]
        assert not [line for line in lines if line.startswith(OPERATOR_ONLY)], lines
        assert IDLE_QUEUE not in r.text and "gpu" not in r.text


def test_the_operator_sees_queued_jobs_by_queue(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    make_verifier(client)
    make_job(client, make_dataset(client), queue=IDLE_QUEUE)
    text = (
        any_api.client(None)
        .get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        .text
    )
    assert f'grpo_queue_depth{{queue="{IDLE_QUEUE}"}}' in text
