"""Per-tenant caps on open work besides jobs (docs/rate-limits.md): open evaluations
(GRPO_EVAL_MAX_OPEN_PER_TENANT) and open Tinker sessions (GRPO_TINKER_MAX_OPEN_SESSIONS), 429
with Retry-After, exact under concurrent submissions on PostgreSQL, one tenant's use leaving
another's places alone, at the default caps (8 evaluations, 16 sessions; Retry-After 30 s)."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import evaluation_body, make_dataset, make_verifier, problem
from tests.e2e.services import RunningService

EVALUATIONS, SESSIONS = 8, 16


def _evaluations_tenant(api: RunningService) -> tuple[httpx.Client, str]:
    client = tenant_client(api)
    make_verifier(client)
    return client, make_dataset(client, "caps")


def _tinker(api: RunningService) -> httpx.Client:
    client = api.client(None)
    client.headers["X-API-Key"] = f"tml-{api.new_key(f'caps-{secrets.token_hex(4)}')}"
    return client


def _new_session(client: httpx.Client) -> httpx.Response:
    return client.post("/api/v1/create_session", json={"tags": [], "sdk_version": "0.38.0"})


def test_open_evaluations_are_capped_per_tenant(any_api: RunningService) -> None:
    a, dataset = _evaluations_tenant(any_api)
    b, b_dataset = _evaluations_tenant(any_api)
    made = [a.post("/v1/evaluations", json=evaluation_body(dataset)) for _ in range(EVALUATIONS)]
    assert [r.status_code for r in made] == [201] * EVALUATIONS, [r.text for r in made]
    over = a.post("/v1/evaluations", json=evaluation_body(dataset))
    body = problem(over, 429)
    assert over.headers["Retry-After"] == "30" and f"limit is {EVALUATIONS}" in body["detail"]
    # another tenant's places are its own
    assert b.post("/v1/evaluations", json=evaluation_body(b_dataset)).status_code == 201
    # a cancelled one frees its place
    assert a.post(f"/v1/evaluations/{made[0].json()['id']}/cancel").status_code == 202
    assert a.post("/v1/evaluations", json=evaluation_body(dataset)).status_code == 201


def test_the_evaluation_cap_is_exact_under_concurrent_submissions(api_pg: RunningService) -> None:
    client, dataset = _evaluations_tenant(api_pg)
    with ThreadPoolExecutor(12) as pool:
        codes = list(
            pool.map(
                lambda _: client.post("/v1/evaluations", json=evaluation_body(dataset)).status_code,
                range(20),
            )
        )
    assert sorted(codes) == [201] * EVALUATIONS + [429] * (20 - EVALUATIONS), codes
    listed = client.get("/v1/evaluations").json()["data"]
    assert len(listed) == EVALUATIONS


def test_open_tinker_sessions_are_capped_per_tenant(any_api: RunningService) -> None:
    a, b = _tinker(any_api), _tinker(any_api)
    sessions = [_new_session(a) for _ in range(SESSIONS)]
    assert [r.status_code for r in sessions] == [200] * SESSIONS, [r.text for r in sessions]
    over = _new_session(a)
    assert over.status_code == 429 and over.headers["Retry-After"] == "30", over.text
    assert f"limit is {SESSIONS}" in over.json()["detail"]
    assert _new_session(b).status_code == 200  # b's places are its own
    first = sessions[0].json()["session_id"]
    assert a.post(f"/api/v1/sessions/{first}/finish").status_code == 200
    assert _new_session(a).status_code == 200  # a finished session frees its place


def test_the_session_cap_is_exact_under_concurrent_creation(api_pg: RunningService) -> None:
    client = _tinker(api_pg)
    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda _: _new_session(client).status_code, range(24)))
    assert sorted(codes) == [200] * SESSIONS + [429] * (24 - SESSIONS), codes
