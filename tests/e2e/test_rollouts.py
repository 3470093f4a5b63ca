"""The rollout store through real processes: jobs trained by the embedded service's worker store
every step's completions; the API pages, filters and downloads them (issue 17 item 1)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from service.demo_task import digit_records
from service.rollouts.format import SCHEMA
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import wait_final

STEPS, PROMPTS, GROUP, RECORDS = 4, 2, 4, 6
# Fails on odd digits, so some rows carry a verifier error.
EVEN_ONLY = """
def verify(prompt, completion, digit, **fields):
    if digit % 2:
        raise ValueError("odd digit")
    return 1.0 if str(digit) in completion else 0.0
"""


def _submit(client: httpx.Client, dataset: str, **spec: Any) -> str:
    body = {
        "base_model": TINY,
        "dataset": dataset,
        "verifiers": [{"name": "has-digit"}, {"name": "even-only"}],
        "grpo": {"steps": STEPS, "prompts_per_step": PROMPTS, "group_size": GROUP},
        "generation": {"max_new_tokens": 6},
        "checkpoint_every": 100,
        **spec,
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture(scope="module")
def jobs(embedded_service: RunningService) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """Two finished jobs of one tenant: rollouts `all` (with eval) and `none` (`sample:k` is
    the production-mode test's job)."""
    svc = embedded_service
    client = svc.client(svc.new_key("rollouts-e2e"))
    regex = {"name": "has-digit", "kind": "regex", "config": {"pattern": "[0-9]"}}
    python = {"name": "even-only", "kind": "python", "config": {"source": EVEN_ONLY}}
    for verifier in (regex, python):
        assert client.post("/v1/verifiers", json=verifier).status_code == 201
    jsonl = "".join(json.dumps(rec) + "\n" for rec in digit_records(RECORDS))
    r = client.post("/v1/datasets", data={"name": "d"}, files={"file": ("d.jsonl", jsonl.encode())})
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    ids = {
        "all": _submit(client, ds, eval_dataset=ds, eval_every=2),
        "none": _submit(client, ds, rollouts="none"),
    }
    for job_id in ids.values():
        assert wait_final(client, job_id)["status"] == "succeeded", svc.logs()
    yield client, ids
    client.close()


def _all_rows(client: httpx.Client, job_id: str, limit: int, **params: Any) -> list[dict]:
    rows, after = [], None
    while True:
        query = {"limit": limit, **params, **({"after": after} if after else {})}
        r = client.get(f"/v1/jobs/{job_id}/rollouts", params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        rows += page["data"]
        if not page["has_more"]:
            assert page["next"] is None
            return rows
        assert page["next"] == page["data"][-1]["id"]
        after = page["next"]


def test_every_step_stores_its_completions(jobs):
    client, ids = jobs
    rows = _all_rows(client, ids["all"], limit=100)
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    per_step = [sum(r["step"] == s for r in train) for s in range(1, STEPS + 1)]
    assert per_step == [PROMPTS * GROUP] * STEPS
    assert sorted({r["step"] for r in evals}) == [2, 4]  # eval_every 2
    assert sum(r["step"] == 2 for r in evals) == RECORDS  # one greedy completion per record
    order = [(r["step"], r["split"] == "eval", r["group"], r["index"]) for r in rows]
    assert order == sorted(order)  # step, train before eval, group, index
    for r in rows:
        assert r["id"] == f"{r['split']}-{r['step']}-{r['group']}-{r['index']}"
        assert set(r["scores"]) == {"has-digit", "even-only"}
        assert r["finish_reason"] == ("length" if r["truncated"] else "stop")
        assert r["prompt"] == digit_records(RECORDS)[r["record"]]["prompt"]
        assert (r["advantage"] is None) == (r["split"] == "eval")
        odd = digit_records(RECORDS)[r["record"]]["digit"] % 2 == 1
        assert ("even-only" in r["errors"]) == odd and (r["scores"]["even-only"] is None) == odd
    for step in range(1, STEPS + 1):
        for group in range(PROMPTS):
            advantages = [r["advantage"] for r in train if (r["step"], r["group"]) == (step, group)]
            assert sum(advantages) == pytest.approx(0.0, abs=1e-4)


def test_paging_walks_the_same_rows_as_one_page(jobs):
    client, ids = jobs
    whole = _all_rows(client, ids["all"], limit=100)
    assert _all_rows(client, ids["all"], limit=7) == whole
    step_2 = _all_rows(client, ids["all"], limit=3, step=2, split="eval")
    assert step_2 == [r for r in whole if (r["step"], r["split"]) == (2, "eval")]


def test_filters(jobs):
    client, ids = jobs
    whole = _all_rows(client, ids["all"], limit=100)
    record = whole[0]["record"]
    assert _all_rows(client, ids["all"], 100, record=record) == [
        r for r in whole if r["record"] == record
    ]
    assert _all_rows(client, ids["all"], 100, min_reward=1.0, max_reward=1.5) == [
        r for r in whole if 1.0 <= r["reward"] <= 1.5
    ]
    failed = _all_rows(client, ids["all"], 100, verifier_error="true")
    assert failed and failed == [r for r in whole if r["errors"]]
    assert _all_rows(client, ids["all"], 100, verifier_error="false") == [
        r for r in whole if not r["errors"]
    ]


def test_a_missing_step_is_an_empty_page_and_bad_filters_are_422(jobs):
    client, ids = jobs
    page = client.get(f"/v1/jobs/{ids['all']}/rollouts", params={"step": 999}).json()
    assert page == {"data": [], "has_more": False, "next": None}
    bad = {
        "split": ("bogus", "query.split"),
        "after": ("train-x", "query.after"),
        "step": ("0", "query.step"),
        "min_reward": ("nan", "query.min_reward"),
    }
    for name, (value, path) in bad.items():
        r = client.get(f"/v1/jobs/{ids['all']}/rollouts", params={name: value})
        assert r.status_code == 422, (name, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert [e["path"] for e in r.json()["errors"]] == [path]
    r = client.get(f"/v1/jobs/{ids['all']}/rollouts", params={"min_reward": 2, "max_reward": 1})
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "query.max_reward"
    spec = {"base_model": TINY, "dataset": "x", "verifiers": [{"name": "has-digit"}]}
    r = client.post("/v1/jobs", json={**spec, "rollouts": "sample:0"})
    assert r.status_code == 422 and "$.rollouts" in [e["path"] for e in r.json()["errors"]]


def test_another_tenants_job_answers_as_a_missing_one(embedded_service, jobs):
    _, ids = jobs
    with embedded_service.client(embedded_service.new_key("rollouts-other")) as other:
        for suffix in ("rollouts", "rollouts/download"):
            theirs = other.get(f"/v1/jobs/{ids['all']}/{suffix}")
            missing = other.get(f"/v1/jobs/job_doesnotexist/{suffix}")
            assert theirs.status_code == missing.status_code == 404
            assert theirs.json()["detail"].replace(ids["all"], "X") == missing.json()[
                "detail"
            ].replace("job_doesnotexist", "X")


def test_download_is_one_parquet_file_of_every_row(jobs):
    client, ids = jobs
    whole = _all_rows(client, ids["all"], limit=100)
    r = client.get(f"/v1/jobs/{ids['all']}/rollouts/download")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/vnd.apache.parquet"
    parquet = pq.ParquetFile(io.BytesIO(r.content))
    assert parquet.metadata.num_row_groups == STEPS + 2  # one per stored file
    table = parquet.read()
    assert table.schema.names == SCHEMA.names and table.num_rows == len(whole)
    frame = table.to_pandas()
    assert list(frame["completion"]) == [row["completion"] for row in whole]
    assert dict(frame["scores"][0]) == whole[0]["scores"]
    evals = pq.read_table(io.BytesIO(client.get(
        f"/v1/jobs/{ids['all']}/rollouts/download", params={"split": "eval"}).content))  # fmt: skip
    assert set(evals.column("split").to_pylist()) == {"eval"} and evals.num_rows == 2 * RECORDS


def test_none_keeps_nothing(jobs):
    client, ids = jobs
    empty = client.get(f"/v1/jobs/{ids['none']}/rollouts").json()
    assert empty == {"data": [], "has_more": False, "next": None}
    r = client.get(f"/v1/jobs/{ids['none']}/rollouts/download")
    assert r.status_code == 200 and pq.read_table(io.BytesIO(r.content)).num_rows == 0


def test_production_mode_stores_in_s3_and_postgresql(production_service: RunningService) -> None:
    """The same path on PostgreSQL and S3 (moto over HTTP): `sample:k` keeps k rows per step,
    paged, then the download."""
    svc = production_service
    with svc.client(svc.new_key("rollouts-prod")) as client:
        regex = {"name": "has-digit", "kind": "regex", "config": {"pattern": "[0-9]"}}
        assert client.post("/v1/verifiers", json=regex).status_code == 201
        jsonl = "".join(json.dumps(rec) + "\n" for rec in digit_records(RECORDS))
        files = {"file": ("d.jsonl", jsonl.encode())}
        ds = client.post("/v1/datasets", data={"name": "d"}, files=files).json()["id"]
        body = {
            "base_model": TINY, "dataset": ds, "verifiers": [{"name": "has-digit"}],
            "grpo": {"steps": 2, "prompts_per_step": PROMPTS, "group_size": GROUP},
            "generation": {"max_new_tokens": 4}, "rollouts": "sample:5",
        }  # fmt: skip
        job = client.post("/v1/jobs", json=body).json()
        assert wait_final(client, job["id"])["status"] == "succeeded", svc.logs()
        rows = _all_rows(client, job["id"], limit=3)
        assert [sum(r["step"] == s for r in rows) for s in (1, 2)] == [5, 5]  # k per step
        assert [r["step"] for r in rows] == [1] * 5 + [2] * 5
        download = client.get(f"/v1/jobs/{job['id']}/rollouts/download")
        table = pq.read_table(io.BytesIO(download.content))
        assert table.column("completion").to_pylist() == [r["completion"] for r in rows]
