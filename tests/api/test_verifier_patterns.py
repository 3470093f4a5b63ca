"""A tenant's regex cannot stall the API: the ReDoS pattern that hung `/test` (and with it
`/healthz`) before regexes ran on RE2 is answered at once, while liveness keeps answering."""

from __future__ import annotations

import threading
import time

import httpx

from tests.e2e.services import RunningService

EVIL_TEXT = "a" * 34 + "b"


def test_catastrophic_regex_is_answered_and_health_keeps_answering(
    api: RunningService, client: httpx.Client
) -> None:
    r = client.post("/v1/verifiers", json={"name": "evil", "kind": "regex",
                                           "config": {"pattern": r"^(a+)+$"}})  # fmt: skip
    assert r.status_code == 201, r.text
    health: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            start = time.monotonic()
            assert api.client(None).get("/healthz", timeout=5).status_code == 200
            health.append(time.monotonic() - start)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        samples = [{"prompt": "p", "completion": EVIL_TEXT * k} for k in (1, 10, 100)]
        start = time.monotonic()
        r = client.post("/v1/verifiers/evil/test", json={"samples": samples}, timeout=30)
        elapsed = time.monotonic() - start
    finally:
        done.set()
        prober.join()
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [0.0, 0.0, 0.0] and r.json()["errors"] == [None] * 3
    # Backtracking would take minutes per sample (2**34 paths); RE2 answers in well under a
    # second. The bounds leave room for a loaded machine (the first call starts the helper).
    assert elapsed < 20.0
    assert health and max(health) < 5.0


def test_a_pattern_re2_cannot_run_is_a_422_naming_the_field(client: httpx.Client) -> None:
    r = client.post("/v1/verifiers", json={"name": "backref", "kind": "regex",
                                           "config": {"pattern": r"(a)\1"}})  # fmt: skip
    assert r.status_code == 422
    (error,) = r.json()["errors"]
    assert error["path"] == "$.config.pattern"
    assert "linear-time regex engine (RE2)" in error["message"]
