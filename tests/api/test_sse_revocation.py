"""An event stream re-checks its API key every keep-alive (GRPO_SSE_KEEPALIVE_S, 1 s in the
API tests) and ends once the key is revoked with `grpo-service revoke-api-key`, within the
keep-alive plus the auth cache's lifetime (0.5 s); a reconnect with the key is then a 401.
Before, a stream opened before the revocation went on for as long as the job lived (here, a
job on a queue no worker serves: forever)."""

from __future__ import annotations

import time

from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier, problem
from tests.api.server import LIMITS
from tests.e2e.services import RunningService

SSE = {"Accept": "text/event-stream"}
ENDS_WITHIN_S = float(LIMITS["GRPO_SSE_KEEPALIVE_S"]) + float(LIMITS["GRPO_AUTH_CACHE_S"]) + 3


def test_a_stream_ends_when_its_key_is_revoked(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    key = client.headers["authorization"].split()[1]
    make_verifier(client)
    job = make_job(client, make_dataset(client))  # queued forever: the stream never ends alone
    url = f"/v1/jobs/{job['id']}/events"
    keepalives, revoked_at, lines = 0, None, []
    with client.stream("GET", url, headers=SSE, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
            if line == ": keep-alive":
                keepalives += 1
                if keepalives == 2 and revoked_at is None:  # streaming and re-checked once
                    any_api.cli("revoke-api-key", key)
                    revoked_at = time.monotonic()
            if revoked_at is not None:
                assert time.monotonic() - revoked_at < ENDS_WITHIN_S, lines[-5:]
        ended_after = time.monotonic() - (revoked_at or 0)
    print(f"stream ended {ended_after:.2f} s after the revocation")
    assert revoked_at is not None and ended_after < ENDS_WITHIN_S
    assert ": the API key was revoked" in lines
    problem(client.get(url, headers=SSE), 401)
