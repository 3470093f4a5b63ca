"""Lists page per the contract: ?limit (1..100, default 20), ?after cursor, newest first."""

from __future__ import annotations

import httpx

from tests.api.helpers import make_dataset, make_job, make_verifier, problem


def _walk(client: httpx.Client, path: str, limit: int) -> list[list[str]]:
    pages, after = [], None
    while True:
        params = {"limit": limit, **({"after": after} if after else {})}
        page = client.get(path, params=params).json()
        assert set(page) == {"data", "has_more", "next"}
        pages.append([item["id"] for item in page["data"]])
        if not page["has_more"]:
            assert page["next"] is None
            return pages
        assert page["next"] == page["data"][-1]["id"]
        after = page["next"]


def test_every_list_pages_newest_first(client: httpx.Client) -> None:
    make_verifier(client)
    datasets = [make_dataset(client, f"d{i}") for i in range(5)]
    assert _walk(client, "/v1/datasets", 2) == [datasets[:2:-1], datasets[2:0:-1], datasets[:1]]
    assert _walk(client, "/v1/datasets", 5) == [datasets[::-1]]
    assert client.get("/v1/datasets").json()["has_more"] is False
    for i in range(2, 5):
        client.post(
            "/v1/verifiers", json={"name": f"v{i}", "kind": "exact_match", "config": {"field": "a"}}
        )
    verifier_pages = _walk(client, "/v1/verifiers", 2)
    assert [len(p) for p in verifier_pages] == [2, 2]
    jobs = [make_job(client, datasets[0])["id"] for _ in range(3)]
    assert _walk(client, "/v1/jobs", 2) == [jobs[:0:-1], jobs[:1]]
    problem(client.get("/v1/jobs?limit=101"), 422)


def test_jobs_filter_by_status(client: httpx.Client) -> None:
    make_verifier(client)
    dataset = make_dataset(client)
    a, b = make_job(client, dataset), make_job(client, dataset)
    client.post(f"/v1/jobs/{a['id']}/cancel")
    cancelled = client.get("/v1/jobs", params={"status": "cancelled"}).json()
    queued = client.get("/v1/jobs", params={"status": "queued", "limit": 1}).json()
    assert [j["id"] for j in cancelled["data"]] == [a["id"]]
    assert [j["id"] for j in queued["data"]] == [b["id"]] and queued["has_more"] is False
