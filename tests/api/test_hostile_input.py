"""Bad input that used to be a 500 (and a reset connection after it) is a 4xx problem, on
SQLite and on PostgreSQL; an unexpected 500 leaves the keep-alive connection usable."""

from __future__ import annotations

import secrets
import sqlite3
from pathlib import Path

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_verifier
from tests.api.test_downloads import seed_checkpoint
from tests.e2e.services import RunningService

BIG = str(2**70)
JSON = {"content-type": "application/json"}


def _connection(r: httpx.Response) -> object:
    return r.extensions["network_stream"]


def _requests(ds: str) -> list[tuple[str, str, dict]]:
    job = {"base_model": "m", "dataset": ds, "verifiers": [{"name": "em"}], "queue": "q"}
    return [
        ("GET", f"/v1/verifiers/em/versions/{BIG}", {}),
        ("GET", "/v1/jobs/job_x/checkpoints/12345678901234567890/download", {}),
        ("GET", "/v1/jobs/job_x/checkpoints/%D9%A3/download", {}),  # an Arabic-Indic digit
        ("GET", f"/v1/jobs/job_x/events?after={BIG}{BIG}", {}),
        ("GET", f"/v1/jobs/job_x/metrics?after_step={BIG}", {}),
        ("GET", "/v1/jobs/job_x/events", {"headers": {"Last-Event-ID": BIG + BIG}}),
        ("GET", "/v1/jobs/job_%00x", {}),
        ("GET", "/v1/jobs?after=%00", {}),
        ("GET", "/v1/datasets?after=x%00", {}),
        ("POST", "/v1/datasets", {"content": '{"name": "d", "records": [{"prompt": "\\ud800"}]}',
                                  "headers": JSON}),
        ("POST", "/v1/datasets", {"content": '{"name": "a\\u0000b", "records": [{"prompt": "x"}]}',
                                  "headers": JSON}),
        ("POST", "/v1/verifiers", {"json": {"name": "v", "kind": "exact_match",
                                            "description": "a\u0000b", "config": {}}}),
        ("POST", "/v1/jobs", {"json": {**job, "generation": {"stop": ["\u0000"]}}}),
        ("POST", "/v1/jobs", {"content": '{"base_model": "\\udfff"}', "headers": JSON}),
    ]  # fmt: skip


def _refused(client: httpx.Client) -> list[httpx.Response]:
    """Each bad request's answer, checked: a 4xx problem, and nothing stored."""
    make_verifier(client)
    ds = make_dataset(client)
    answers = []
    for method, url, kwargs in _requests(ds):
        r = client.request(method, url, **kwargs)
        assert 400 <= r.status_code < 500, (method, url, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json", (url, r.text)
        answers.append(r)
    assert client.get("/v1/jobs").json()["data"] == []  # nothing was stored
    return answers


def test_bad_input_is_a_4xx_problem(any_api: RunningService) -> None:
    with tenant_client(any_api) as client:
        _refused(client)


def test_bad_input_leaves_the_connection_usable(api_http: RunningService) -> None:
    with tenant_client(api_http) as client:
        first = client.get("/v1/jobs")
        for r in _refused(client):
            assert _connection(r) is _connection(first), (r.url, "the connection was replaced")


def test_unstorable_text_is_named_by_its_path(client: httpx.Client) -> None:
    body = '{"name": "d", "records": [{"prompt": "ok"}, {"prompt": "x", "f": ["\\ud800"]}]}'
    r = client.post("/v1/datasets", content=body, headers=JSON)
    assert r.status_code == 422
    assert r.json()["errors"] == [
        {"path": "$.records[1].f[0]", "message": "text must be valid Unicode (it holds a lone "
         "surrogate)"},
    ]  # fmt: skip


def test_a_500_leaves_the_connection_usable(api_http: RunningService) -> None:
    """A storage failure (here: a file where the tenant's folder must go) is a 500 problem, and
    the next request on the same connection is served."""
    api = api_http
    name = f"t-{secrets.token_hex(4)}"
    with tenant_client(api, name) as client:
        data = Path(api.env["GRPO_DATA_DIR"])
        with sqlite3.connect(data / "grpo.db") as db:
            (tenant_id,) = db.execute("SELECT id FROM tenants WHERE name = ?", (name,)).fetchone()
        blocker = data / "objects" / "tenants" / tenant_id
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("not a folder")
        first = client.get("/v1/datasets")
        r = client.post("/v1/datasets", json={"name": "d", "records": [{"prompt": "p"}]})
        assert r.status_code == 500 and r.json()["detail"] == "internal server error"
        after = client.get("/v1/datasets")
        assert after.status_code == 200 and after.json()["data"] == []  # rolled back
        assert _connection(r) is _connection(first) is _connection(after)


def test_deep_json_and_huge_ranges_are_not_500s(api: RunningService) -> None:
    with tenant_client(api) as client:
        deep = "[" * 100_000 + "]" * 100_000
        body = '{"name": "deep", "records": [{"prompt": "p", "f": ' + deep + "}]}"
        r = client.post("/v1/datasets", content=body, headers=JSON)
        assert r.status_code == 422  # read as bare events: no prefix strings, quadratic in depth
        assert r.json()["errors"][0]["message"] == "nested more than 64 levels deep"
        job_id, _ = seed_checkpoint(api, client, b"0123456789")
        url = f"/v1/jobs/{job_id}/checkpoints/2/download"
        r = client.get(url, headers={"Range": "bytes=" + "9" * 5000 + "-"})
        assert r.status_code == 200 and r.content == b"0123456789"  # ignored, as RFC 9110 allows
        r = client.get(url, headers={"Range": "bytes=2-4"})
        assert r.status_code == 206 and r.content == b"234"
