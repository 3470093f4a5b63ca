"""Small builders shared by the API tests."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.server import IDLE_QUEUE
from tests.e2e.services import TINY

PROBLEM = "application/problem+json"


def problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body = r.json()
    assert {"type", "title", "status", "detail"} <= set(body) and body["status"] == status
    return body


def error_paths(r: httpx.Response) -> list[str]:
    return [e["path"] for e in r.json().get("errors", [])]


def make_dataset(client: httpx.Client, name: str = "d", n: int = 2) -> str:
    records = [{"prompt": f"Digit {i}:", "answer": str(i)} for i in range(n)]
    r = client.post("/v1/datasets", json={"name": name, "records": records})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def make_verifier(client: httpx.Client, name: str = "em") -> None:
    r = client.post(
        "/v1/verifiers", json={"name": name, "kind": "exact_match", "config": {"field": "answer"}}
    )
    assert r.status_code == 201, r.text


def job_body(dataset: str, **extra: Any) -> dict[str, Any]:
    return {
        "base_model": TINY,
        "dataset": dataset,
        "verifiers": [{"name": "em"}],
        "grpo": {"steps": 2, "prompts_per_step": 1, "group_size": 2},
        "queue": IDLE_QUEUE,
        **extra,
    }


def evaluation_body(dataset: str, **extra: Any) -> dict[str, Any]:
    """An evaluation no worker takes (its queue has none)."""
    return {
        "model": TINY,
        "dataset": dataset,
        "verifiers": [{"name": "em"}],
        "samples_per_prompt": 2,
        "queue": IDLE_QUEUE,
        **extra,
    }


def make_job(client: httpx.Client, dataset: str, **extra: Any) -> dict[str, Any]:
    r = client.post("/v1/jobs", json=job_body(dataset, **extra))
    assert r.status_code == 201, r.text
    return r.json()
