"""Evaluations through the real processes (API + worker, tiny model): the base model evaluated
with a built-in and a sandboxed python verifier, results that agree with the stored samples
(pass@1 <= pass@2 <= pass@4), usage metered, a stranger seeing nothing, and a running
evaluation cancelled. A checkpoint's evaluation: tests/client/test_evaluations.py."""

from __future__ import annotations

import math
import time
from typing import Any

import httpx
import pytest

from service.demo_task import DIGIT_VERIFIER_SOURCE, digit_records
from tests.e2e.services import TINY, RunningService

K = 4
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def client(embedded_service: RunningService) -> httpx.Client:
    c = embedded_service.client(embedded_service.new_key("evaluations"))
    verifiers = [
        {"name": "has-digit", "kind": "regex", "config": {"pattern": "[0-9]"}},
        {"name": "digits", "kind": "python", "config": {"source": DIGIT_VERIFIER_SOURCE}},
    ]
    for v in verifiers:
        assert c.post("/v1/verifiers", json=v).status_code == 201
    r = c.post("/v1/datasets", json={"name": "digits", "records": digit_records(16)})
    assert r.status_code == 201, r.text
    return c


def body(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "dataset": "digits",
        # the reward is has-digit's score; digits (weight 0) is only reported
        "verifiers": [{"name": "has-digit"}, {"name": "digits", "weight": 0.0}],
        "samples_per_prompt": K,
        "generation": {"max_new_tokens": 8},
        "max_records": 6,
        **extra,
    }


def wait_evaluation(client: httpx.Client, eval_id: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = client.get(f"/v1/evaluations/{eval_id}").json()
        if got["status"] in FINAL:
            return got
        time.sleep(0.2)
    raise AssertionError(f"evaluation {eval_id} did not finish: {got}")


def all_samples(client: httpx.Client, eval_id: str) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    after = None
    while True:
        params = {"limit": 10, **({"after": after} if after else {})}
        page = client.get(f"/v1/evaluations/{eval_id}/samples", params=params).json()
        samples += page["data"]
        if not page["has_more"]:
            return samples
        after = page["next"]


def check_results(client: httpx.Client, evaluation: dict[str, Any]) -> None:
    assert evaluation["status"] == "succeeded", evaluation
    results = evaluation["results"]
    samples = all_samples(client, evaluation["id"])
    assert [s["index"] for s in samples] == list(range(6 * K))
    assert results["samples"] == 6 * K and results["prompts"] == 6
    assert [s["record"] for s in samples] == [i // K for i in range(6 * K)]
    for s in samples:
        assert s["reward"] == s["scores"]["has-digit"] and s["passed"] == (s["reward"] >= 1.0)
        assert s["completion"] in s["completion"] and s["prompt"].startswith("Digit")
    rewards = [s["reward"] for s in samples]
    assert results["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    digits = [s["scores"]["digits"] for s in samples]
    assert results["per_verifier"]["digits"] == pytest.approx(sum(digits) / len(digits))
    assert set(results["pass_at_k"]) == {"1", "2", "4"}
    p = {k: v["estimate"] for k, v in results["pass_at_k"].items()}
    assert p["1"] == pytest.approx(sum(s["passed"] for s in samples) / len(samples))
    assert p["1"] <= p["2"] <= p["4"]
    for v in results["pass_at_k"].values():
        assert 0.0 <= v["low"] <= v["estimate"] <= v["high"] <= 1.0
    assert results["completion_tokens"] == sum(s["length"] for s in samples) > 0
    usage = evaluation["usage"]
    assert usage["completion_tokens"] == results["completion_tokens"]
    assert 0 < usage["device_seconds"] < 300


def test_base_model(client: httpx.Client, embedded_service: RunningService) -> None:
    """(A checkpoint's evaluation: tests/client/test_evaluations.py, on the shared trained job.)"""
    created = client.post("/v1/evaluations", json=body(TINY))
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "queued" and created.json()["records"] == 6
    evaluation = wait_evaluation(client, created.json()["id"])
    check_results(client, evaluation)
    assert client.get("/v1/evaluations").json()["data"][0]["id"] == evaluation["id"]
    # metered as jobs are: under its id, its device seconds and completion tokens
    usage = client.get("/v1/usage", params={"group_by": "job"}).json()
    row = {r["job_id"]: r for r in usage["data"]}[evaluation["id"]]
    assert row["completion_tokens"] == evaluation["usage"]["completion_tokens"]
    assert math.isclose(row["device_seconds"], evaluation["usage"]["device_seconds"])
    # another tenant: the evaluation and its samples read as missing
    stranger = embedded_service.client(embedded_service.new_key("evaluations-stranger"))
    for path in ("", "/samples"):
        assert stranger.get(f"/v1/evaluations/{evaluation['id']}{path}").status_code == 404
    assert stranger.get("/v1/evaluations").json()["data"] == []


def test_cancel_a_running_evaluation(client: httpx.Client) -> None:
    big = body(TINY, samples_per_prompt=32, max_records=10, generation={"max_new_tokens": 16})
    r = client.post("/v1/evaluations", json=big)
    assert r.status_code == 201, r.text
    eval_id = r.json()["id"]
    deadline = time.monotonic() + 120
    while client.get(f"/v1/evaluations/{eval_id}").json()["status"] == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelled = client.post(f"/v1/evaluations/{eval_id}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["status"] in ("cancelling", "cancelled")
    start = time.monotonic()
    final = wait_evaluation(client, eval_id, timeout=60)
    assert final["status"] == "cancelled" and final["results"] is None, final
    assert time.monotonic() - start < 30
    assert final["usage"]["device_seconds"] > 0  # the time it held the worker is metered
    assert len(all_samples(client, eval_id)) < 10 * 32  # it stopped before the end
    assert client.post(f"/v1/evaluations/{eval_id}/cancel").status_code == 409


def test_an_evaluation_stops_at_its_tenants_budget(embedded_service: RunningService) -> None:
    """The budget holds while it runs: its device time counts as it goes, and the run stops at
    the first batch boundary past the budget, failed with `budget_exhausted`, its samples kept."""
    from service.usage.service import set_budget

    c = embedded_service.client(embedded_service.new_key("evaluations-budget"))
    made = c.post("/v1/verifiers", json={"name": "has-digit", "kind": "regex",
                                         "config": {"pattern": "[0-9]"}})  # fmt: skip
    assert made.status_code == 201, made.text
    r = c.post("/v1/datasets", json={"name": "digits", "records": digit_records(16)})
    assert r.status_code == 201, r.text
    with embedded_service.session() as session:  # ~0.4 ms: spent by its first batch
        set_budget(session, "evaluations-budget", 1e-7)
    three_batches = {"verifiers": [{"name": "has-digit"}], "samples_per_prompt": 32}
    r = c.post("/v1/evaluations", json=body(TINY, **three_batches))
    assert r.status_code == 201, r.text
    final = wait_evaluation(c, r.json()["id"])
    assert final["status"] == "failed" and final["error"]["code"] == "budget_exhausted", final
    assert "device-hour budget exhausted" in final["error"]["message"]
    kept = all_samples(c, final["id"])
    assert 0 < len(kept) < 6 * 32 and f"stopped after {len(kept)} of {6 * 32}" in str(final)
    refused = c.post("/v1/evaluations", json=body(TINY, **three_batches))
    assert refused.status_code == 402, refused.text
