"""API keys with scopes (issue 21 item 7): a `read` key (`grpo-service create-api-key --scope
read`) may GET and HEAD, and any other method answers 403 before anything is done; the
operator lists keys (`grpo-service keys list`) and revokes one by id (`keys revoke`), which
stops it within the auth cache's lifetime (GRPO_AUTH_CACHE_S, 0.5 s here) even while the key
is in use, and so cached, in the API process."""

from __future__ import annotations

import secrets
import threading
import time

from tests.api.helpers import make_dataset, make_job, make_verifier, problem
from tests.api.server import LIMITS
from tests.e2e.services import RunningService

REVOKED_WITHIN_S = float(LIMITS["GRPO_AUTH_CACHE_S"]) + 1.5


def _read_key(svc: RunningService, tenant: str) -> str:
    out = svc.cli("create-api-key", "--tenant", tenant, "--scope", "read")
    return out.strip().splitlines()[-1]


def _listed(svc: RunningService, tenant: str) -> list[dict[str, str]]:
    lines = svc.cli("keys", "list", "--tenant", tenant).splitlines()
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=True)) for line in lines[1:]]


def test_a_read_key_reads_and_changes_nothing(api: RunningService) -> None:
    tenant = f"t-{secrets.token_hex(4)}"
    full = api.client(api.new_key(tenant))
    make_verifier(full)
    dataset = make_dataset(full)
    job = make_job(full, dataset)
    read = api.client(_read_key(api, tenant))

    me = read.get("/v1/me").json()
    assert me["tenant"] == tenant and me["key"]["scope"] == "read"
    assert full.get("/v1/me").json()["key"]["scope"] == "full"
    assert read.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"
    assert [d["id"] for d in read.get("/v1/datasets").json()["data"]] == [dataset]
    assert read.head("/v1/models").status_code in (200, 405)  # HEAD passes the scope check

    refused = [
        read.post("/v1/verifiers", json={"name": "x", "kind": "exact_match", "config": {}}),
        read.post("/v1/jobs", json={}),  # refused before the body is validated
        read.post(f"/v1/jobs/{job['id']}/cancel"),
        read.delete(f"/v1/datasets/{dataset}"),
        read.delete("/v1/datasets/ds_missing"),  # 403, not 404: nothing is looked up
    ]
    for r in refused:
        assert problem(r, 403)["detail"] == "this key is read-only"
    assert read.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"  # not cancelled
    assert read.get(f"/v1/datasets/{dataset}").status_code == 200  # not deleted


def test_keys_are_listed_and_a_revoked_key_stops_within_seconds(api: RunningService) -> None:
    tenant = f"t-{secrets.token_hex(4)}"
    full_key = api.new_key(tenant)
    read_key = _read_key(api, tenant)
    listed = _listed(api, tenant)
    assert {(k["prefix"], k["scope"]) for k in listed} == {
        (full_key[:12], "full"),
        (read_key[:12], "read"),
    }
    assert all(k["tenant"] == tenant and k["revoked"] == "-" for k in listed)
    assert listed[0]["prefix"] == read_key[:12]  # newest first
    key_id = next(k["id"] for k in listed if k["prefix"] == full_key[:12])

    client = api.client(full_key)
    assert client.get("/v1/me").json()["key"]["id"] == key_id
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:  # in use: the API process has the key cached
        assert client.get("/v1/me").status_code == 200
    # Revoke while the key keeps polling, so that the API process holds it freshly cached
    # when the revocation commits (the CLI exits 1 when no active key matches).
    revoked_at: list[float] = []

    def revoke() -> None:
        api.cli("keys", "revoke", key_id)
        revoked_at.append(time.monotonic())

    thread = threading.Thread(target=revoke)
    thread.start()
    while client.get("/v1/me").status_code == 200:
        assert not revoked_at or time.monotonic() - revoked_at[0] < REVOKED_WITHIN_S
    stopped = time.monotonic()
    thread.join()
    stopped_after = stopped - revoked_at[0]  # negative: stopped before the CLI process exited
    print(f"a revoked key stopped working {stopped_after:.2f} s after `keys revoke`")
    assert problem(client.get("/v1/jobs"), 401)["detail"] == "invalid or revoked API key"
    assert api.client(read_key).get("/v1/me").status_code == 200  # the other key lives on

    after = {k["id"]: k for k in _listed(api, tenant)}
    assert after[key_id]["revoked"] != "-" and after[key_id]["last_used"] != "-"
    assert sum(k["revoked"] == "-" for k in after.values()) == 1
