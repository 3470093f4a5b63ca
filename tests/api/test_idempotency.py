"""Idempotency-Key on creating POSTs: replay, mismatch, and exactly-once under concurrency."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import job_body, make_dataset, make_verifier, problem
from tests.e2e.services import RunningService


def _key() -> dict[str, str]:
    return {"Idempotency-Key": secrets.token_hex(16)}


def test_twenty_concurrent_duplicates_create_one_job(any_api: RunningService) -> None:
    setup = tenant_client(any_api)
    dataset = make_dataset(setup)
    make_verifier(setup)
    headers = {**setup.headers, **_key()}
    body = job_body(dataset)

    def post(_: int) -> httpx.Response:
        with any_api.client(None) as c:
            c.headers.update(headers)
            return c.post("/v1/jobs", json=body)

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(post, range(20)))
    assert [r.status_code for r in responses] == [201] * 20, [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    replayed = [r.headers.get("Idempotent-Replayed") == "true" for r in responses]
    assert sum(replayed) == 19
    assert len(setup.get("/v1/jobs").json()["data"]) == 1
    # and long after, the same again: replayed
    again = setup.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 201 and again.json() == responses[0].json()


def test_same_key_other_body_is_409(client: httpx.Client) -> None:
    headers = _key()
    r1 = client.post(
        "/v1/datasets", json={"name": "a", "records": [{"prompt": "x"}]}, headers=headers
    )
    assert r1.status_code == 201
    r2 = client.post(
        "/v1/datasets", json={"name": "b", "records": [{"prompt": "x"}]}, headers=headers
    )
    assert "another" in problem(r2, 409)["detail"]
    # the same key on another route is another request too
    r3 = client.post(
        "/v1/verifiers",
        json={"name": "v", "kind": "exact_match", "config": {"field": "answer"}},
        headers=headers,
    )
    problem(r3, 409)
    # same body re-serialised differently (key order, spaces) is the same request
    r4 = client.post(
        "/v1/datasets",
        content=b'{"records": [{"prompt": "x"}],   "name": "a"}',
        headers={**headers, "content-type": "application/json"},
    )
    assert r4.status_code == 201 and r4.json() == r1.json()
    assert r4.headers["Idempotent-Replayed"] == "true"


def test_multipart_dataset_replays_despite_a_new_boundary(client: httpx.Client) -> None:
    headers = _key()
    files = {"file": ("d.jsonl", b'{"prompt": "a"}\n{"prompt": "b"}\n')}
    r1 = client.post("/v1/datasets", data={"name": "up"}, files=files, headers=headers)
    r2 = client.post("/v1/datasets", data={"name": "up"}, files=files, headers=headers)
    assert r1.status_code == r2.status_code == 201
    assert r2.json() == r1.json() and r2.headers["Idempotent-Replayed"] == "true"
    other = {"file": ("d.jsonl", b'{"prompt": "c"}\n')}
    problem(client.post("/v1/datasets", data={"name": "up"}, files=other, headers=headers), 409)
    names = [d["name"] for d in client.get("/v1/datasets").json()["data"]]
    assert names.count("up") == 1


def test_errors_are_not_stored_and_the_key_can_be_retried(client: httpx.Client) -> None:
    headers = _key()
    bad = client.post("/v1/datasets", json={"name": "x", "records": [{"q": 1}]}, headers=headers)
    problem(bad, 422)
    assert "Idempotent-Replayed" not in bad.headers
    fixed = client.post(
        "/v1/datasets", json={"name": "x", "records": [{"prompt": "q"}]}, headers=headers
    )
    assert fixed.status_code == 201, fixed.text


def test_verifier_and_cancel_are_idempotent(client: httpx.Client) -> None:
    headers = _key()
    body = {"name": "idem", "kind": "exact_match", "config": {"field": "answer"}}
    first = client.post("/v1/verifiers", json=body, headers=headers)
    second = client.post("/v1/verifiers", json=body, headers=headers)
    assert first.json() == second.json() and second.json()["version"] == 1
    assert client.get("/v1/verifiers/idem").json()["version"] == 1

    make_verifier(client)
    job = client.post("/v1/jobs", json=job_body(make_dataset(client))).json()
    cancel = _key()
    r1 = client.post(f"/v1/jobs/{job['id']}/cancel", headers=cancel)
    r2 = client.post(f"/v1/jobs/{job['id']}/cancel", headers=cancel)
    assert r1.status_code == r2.status_code == 202 and r2.headers["Idempotent-Replayed"] == "true"
    problem(client.post(f"/v1/jobs/{job['id']}/cancel"), 409)  # without the key: finished


def test_keys_are_per_tenant(api: RunningService) -> None:
    headers = _key()
    a, b = tenant_client(api), tenant_client(api)
    body = {"name": "same", "records": [{"prompt": "x"}]}
    ra = a.post("/v1/datasets", json=body, headers=headers)
    rb = b.post("/v1/datasets", json=body, headers=headers)
    assert ra.status_code == rb.status_code == 201
    assert ra.json()["id"] != rb.json()["id"] and "Idempotent-Replayed" not in rb.headers


def test_bad_key_is_a_422(client: httpx.Client) -> None:
    r = client.post(
        "/v1/datasets",
        json={"name": "x", "records": [{"prompt": "q"}]},
        headers={"Idempotency-Key": "x" * 300},
    )
    assert problem(r, 422)["errors"][0]["path"] == "header.Idempotency-Key"
