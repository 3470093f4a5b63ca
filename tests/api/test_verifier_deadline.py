"""`/test` of a built-in kind on a pathological input answers within the built-in kinds'
per-batch deadline (GRPO_BUILTIN_VERIFIER_TIMEOUT_S, 10 s) with a per-item error, while the
API keeps answering (issue 16 item 8, issue 22 item 1). Before, the numeric kind's LaTeX
clean-up ran in the API process, in C with the GIL held, for minutes: `/test` and `/healthz`
with it."""

from __future__ import annotations

import threading
import time

import httpx

from tests.e2e.services import RunningService

DEADLINE_S = 10.0
SLOW_FRAC = "\\frac{" + " " * 6000  # cubic backtracking in Python `re`: hours in C
NESTED = {"$defs": {"x": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/x"},
                                                             {"$ref": "#/$defs/x"}]}}},
          "$ref": "#/$defs/x"}  # fmt: skip


def _timed_test_with_health(
    api: RunningService, client: httpx.Client, name: str, samples: list[dict]
) -> tuple[httpx.Response, float, list[float]]:
    health: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            start = time.monotonic()
            assert api.client(None).get("/healthz", timeout=5).status_code == 200
            health.append(time.monotonic() - start)
            time.sleep(0.1)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        start = time.monotonic()
        r = client.post(f"/v1/verifiers/{name}/test", json={"samples": samples}, timeout=60)
        elapsed = time.monotonic() - start
    finally:
        done.set()
        prober.join()
    return r, elapsed, health


def test_a_pathological_numeric_input_is_a_timeout_error_within_the_deadline(
    api: RunningService, client: httpx.Client
) -> None:
    r = client.post("/v1/verifiers", json={"name": "num", "kind": "numeric", "config": {}})
    assert r.status_code == 201, r.text
    samples = [
        {"prompt": "p", "completion": "the answer is 42", "answer": 42},
        {"prompt": "p", "completion": SLOW_FRAC, "answer": 1},
    ]
    r, elapsed, health = _timed_test_with_health(api, client, "num", samples)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scores"] == [1.0, None]
    assert body["errors"][0] is None
    assert body["errors"][1].startswith("timeout: the batch did not finish within 10s")
    assert DEADLINE_S <= elapsed < DEADLINE_S + 3, elapsed
    assert health and max(health) < 1.0, max(health)


def test_a_composite_of_a_json_schema_explosion_answers_within_the_deadline(
    api: RunningService, client: httpx.Client
) -> None:
    r = client.post("/v1/verifiers", json={"name": "nested", "kind": "json_schema",
                                           "config": {"schema": NESTED}})  # fmt: skip
    assert r.status_code == 201, r.text
    config = {"parts": [{"name": "nested"}]}
    r = client.post("/v1/verifiers", json={"name": "mix", "kind": "composite", "config": config})
    assert r.status_code == 201, r.text
    samples = [{"prompt": "p", "completion": "[[]]"},
               {"prompt": "p", "completion": "[" * 40 + "1" + "]" * 40}]  # fmt: skip
    r, elapsed, health = _timed_test_with_health(api, client, "mix", samples)
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [1.0, None]
    assert r.json()["errors"][1].startswith("part nested@1: timeout:")
    assert elapsed < DEADLINE_S + 3, elapsed
    assert health and max(health) < 1.0, max(health)
