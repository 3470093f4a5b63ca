"""A pending Tinker request's place in the queue, through the API alone (no tinker worker: its
requests wait): a tenant is told of its own requests ahead of it, never of another tenant's
(docs/rate-limits.md)."""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from tests.e2e.services import TINY, RunningService

SAMPLE = {
    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 9]}]},
    "sampling_params": {"max_tokens": 2},
    "base_model": TINY,
}


def _tinker(api: RunningService, tenant: str) -> httpx.Client:
    client = api.client(None)
    client.headers["X-API-Key"] = f"tml-{api.new_key(tenant)}"
    return client


def _sample(client: httpx.Client) -> str:
    r = client.post("/api/v1/asample", json=SAMPLE)
    assert r.status_code == 200, r.text
    return r.json()["request_id"]


def _pending(client: httpx.Client, request_id: str) -> dict[str, Any]:
    r = client.post("/api/v1/retrieve_future", json={"request_id": request_id})
    assert r.status_code == 200 and r.json()["type"] == "try_again", r.text
    return r.json()


def test_a_tenant_sees_only_its_own_place_in_the_queue(api: RunningService) -> None:
    a, b = (_tinker(api, f"tinker-{name}-{secrets.token_hex(4)}") for name in "ab")
    a_first, a_second = _sample(a), _sample(a)
    before = _pending(a, a_second)
    assert before["queue_position"] == 1, before  # its own first request, nothing else
    assert before["queue_state_reason"] == "queued, 1 of yours ahead"
    b_requests = [_sample(b) for _ in range(3)]
    assert _pending(a, a_second) == before  # b's queued requests change nothing a sees
    assert _pending(a, a_first)["queue_position"] == 0
    assert _pending(b, b_requests[0])["queue_position"] == 0  # nor do a's change b's
    assert _pending(b, b_requests[2])["queue_position"] == 2
