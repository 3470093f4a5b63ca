"""One tenant's slow verifier tests cannot starve the others: `/test` holds no database
connection while tenant code runs, a tenant runs at most GRPO_MAX_CONCURRENT_TESTS_PER_TENANT
(4) at once (429 with Retry-After beyond), and liveness needs neither a thread nor the database."""

from __future__ import annotations

import subprocess
import threading
import time
from urllib.parse import urlsplit

import httpx

from tests.api.conftest import tenant_client
from tests.e2e.services import RunningService

SLOW = "import time\ndef verify(prompt, completion, **kw):\n    time.sleep(3)\n    return 1.0\n"


def _idle_in_transaction(svc: RunningService) -> int | None:
    """Connections of the service's PostgreSQL database sitting inside a transaction."""
    url = svc.env.get("GRPO_DATABASE_URL")
    if not url:
        return None
    database = urlsplit(url).path.lstrip("/")
    sql = ("SELECT count(*) FROM pg_stat_activity WHERE datname = "
           f"'{database}' AND state = 'idle in transaction'")  # fmt: skip
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-tAc", sql],
                         check=True, capture_output=True, text=True)  # fmt: skip
    return int(out.stdout.strip())


def test_slow_tests_are_capped_and_hold_no_connection(any_api: RunningService) -> None:
    owner, other = tenant_client(any_api), tenant_client(any_api)
    body = {"name": "slow", "kind": "python", "config": {"source": SLOW, "timeout_s": 30}}
    assert owner.post("/v1/verifiers", json=body).status_code == 201
    sample = {"samples": [{"prompt": "p", "completion": "c"}]}
    answers: list[httpx.Response] = []

    def call() -> None:
        with any_api.client(owner.headers["authorization"].split()[1]) as c:
            answers.append(c.post("/v1/verifiers/slow/test", json=sample, timeout=60))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # the admitted calls are inside the verifier now
    idle = _idle_in_transaction(any_api)
    latencies = []
    for _ in range(5):
        start = time.monotonic()
        assert other.get("/v1/jobs").status_code == 200
        assert any_api.client(None).get("/healthz", timeout=5).status_code == 200
        latencies.append(time.monotonic() - start)
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 4 + [429] * 4, [r.text for r in answers]
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["retry-after"] == "1" and "the limit is 4" in refused.json()["detail"]
    assert all(r.json()["scores"] == [1.0] for r in answers if r.status_code == 200)
    assert max(latencies) < 2.0, latencies
    assert idle in (None, 0), f"{idle} connections held inside a transaction during /test"
    assert owner.post("/v1/verifiers/slow/test", json=sample, timeout=60).status_code == 200


def test_a_nested_composite_is_resolved_before_its_test_runs(client: httpx.Client) -> None:
    for name, field in (("a", "x"), ("b", "y")):
        cfg = {"name": name, "kind": "exact_match", "config": {"field": field}}
        assert client.post("/v1/verifiers", json=cfg).status_code == 201
    inner = {"parts": [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.25}]}
    r = client.post("/v1/verifiers", json={"name": "inner", "kind": "composite", "config": inner})
    assert r.status_code == 201, r.text
    outer = {"parts": [{"name": "inner", "weight": 2.0}, {"name": "a", "weight": 1.0}]}
    r = client.post("/v1/verifiers", json={"name": "outer", "kind": "composite", "config": outer})
    assert r.status_code == 201, r.text
    samples = [{"prompt": "p", "completion": c, "x": "1", "y": "2"} for c in ("1", "2", "3")]
    r = client.post("/v1/verifiers/outer/test", json={"samples": samples})
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [2.0, 0.5, 0.0]  # 2 * (0.5 a + 0.25 b) + 1 * a
