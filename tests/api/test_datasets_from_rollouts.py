"""Datasets made from a job's stored rollouts (`POST /v1/datasets/from-rollouts`) and any
dataset's records paged (`GET /v1/datasets/{id}/records`), on SQLite and PostgreSQL.

The job is submitted through the API (no worker runs here); its rollouts are written as a
worker writes them, by the product's rollout store (`RolloutWriter`: Parquet upload, then the
fenced `rollout_files` row), on rows whose rewards the tests choose."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import pytest

from service.jobs import lifecycle
from service.models import Job
from service.storage import open_storage_from_settings
from service.training.rollout_store import RolloutWriter
from tests.api.conftest import tenant_client
from tests.api.helpers import job_body, make_dataset, make_job, make_verifier, problem
from tests.e2e.services import RunningService

CHAT = [{"role": "user", "content": "Say 2"}]


def row(step: int, group: int, index: int, reward: float, split: str = "train") -> dict[str, Any]:
    chat = group == 1 and step == 2  # one chat-shaped record: its messages are the prompt
    return {"step": step, "split": split, "group": group, "index": index, "record": group,
            "prompt": f"<s>p{step}{group}", "messages": CHAT if chat else None,
            "completion": f"c{step}{group}{index}{split[0]}", "reward": reward,
            "scores": {"em": reward}, "advantage": None if split == "eval" else 0.0,
            "length": 3, "truncated": False, "finish_reason": "stop", "errors": {}}  # fmt: skip


# step -> rows, in the order a worker stores them (group, index)
TRAIN = {
    1: [row(1, 0, 0, 1.0), row(1, 0, 1, 0.0), row(1, 0, 2, 0.5),   # differ
        row(1, 1, 0, 0.5), row(1, 1, 1, 0.5)],                     # equal: no dpo pair
    2: [row(2, 0, 0, 0.25), row(2, 0, 1, 0.25),                    # equal
        row(2, 1, 0, 0.2), row(2, 1, 1, 0.9), row(2, 1, 2, 0.9)],  # differ, a tie at the top
}  # fmt: skip
EVAL = {1: [row(1, 0, 0, 0.3, "eval"), row(1, 0, 1, 0.3, "eval")],
        2: [row(2, 0, 0, 0.7, "eval"), row(2, 0, 1, 0.1, "eval")]}  # fmt: skip


def prompt_of(r: dict[str, Any]) -> Any:
    return r["messages"] if r["messages"] is not None else r["prompt"]


def sft(rows: list[dict[str, Any]], min_reward: float | None = None) -> list[dict[str, Any]]:
    return [{"prompt": prompt_of(r), "completion": r["completion"], "reward": r["reward"]}
            for r in rows if min_reward is None or r["reward"] >= min_reward]  # fmt: skip


def store_rollouts(svc: RunningService, job_id: str, batches: dict[str, dict[int, list]]) -> None:
    """Claim the job as a worker would and write its steps through the rollout store."""
    settings = svc.settings()
    with svc.session() as s:
        tenant = s.get(Job, job_id).tenant_id
        epoch = lifecycle.claim(s, job_id, 600, "test-worker")
    assert epoch is not None

    def fenced(write: Any, *args: Any) -> Any:
        with svc.session() as s:
            return write(s, job_id, epoch, *args)

    events: list[Any] = []
    writer = RolloutWriter(job_id, tenant, epoch, "all", 0, open_storage_from_settings(settings),
                           settings, fenced, lambda *e: events.append(e), svc.session)  # fmt: skip
    for split, steps in batches.items():
        for step, rows in steps.items():
            writer(step, split, rows)
    assert not events, events


def records(client: httpx.Client, dataset_id: str, limit: int = 100) -> list[dict[str, Any]]:
    found, after = [], None
    while True:
        params: dict[str, Any] = {"limit": limit} | ({"after": after} if after else {})
        r = client.get(f"/v1/datasets/{dataset_id}/records", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert [d["id"] for d in page["data"]] == [str(d["index"]) for d in page["data"]]
        found += page["data"]
        if not page["has_more"]:
            assert page["next"] is None
            break
        assert page["next"] == page["data"][-1]["id"]
        after = page["next"]
    assert [d["index"] for d in found] == list(range(len(found)))
    return [d["record"] for d in found]


@pytest.fixture
def tenant(any_api: RunningService) -> httpx.Client:
    client = tenant_client(any_api)
    make_verifier(client)
    return client


@pytest.fixture
def job_id(any_api: RunningService, tenant: httpx.Client) -> str:
    job = make_job(tenant, make_dataset(tenant))
    store_rollouts(any_api, job["id"], {"train": TRAIN, "eval": EVAL})
    return job["id"]


def make(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/datasets/from-rollouts", json=body)


def test_sft_keeps_every_completion_in_order(tenant: httpx.Client, job_id: str) -> None:
    stored = [r for step in (1, 2) for r in TRAIN[step]]
    got = tenant.get(f"/v1/jobs/{job_id}/rollouts", params={"split": "train", "limit": 100})
    assert [r["completion"] for r in got.json()["data"]] == [r["completion"] for r in stored]
    r = make(tenant, job_id=job_id, format="sft")
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["name"] == f"{job_id}-sft" and ds["num_records"] == len(stored)
    assert records(tenant, ds["id"]) == sft(stored)
    assert records(tenant, ds["id"], limit=3) == sft(stored)  # pages round-trip every record
    # the download is the same records, as JSONL
    content = tenant.get(f"/v1/datasets/{ds['id']}/download")
    assert content.status_code == 200, content.text
    assert [json.loads(line) for line in content.text.splitlines()] == sft(stored)


def test_sft_filters_by_step_split_and_min_reward(tenant: httpx.Client, job_id: str) -> None:
    r = make(tenant, job_id=job_id, format="sft", steps=[2], min_reward=0.25, name="good")
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "good"
    assert records(tenant, r.json()["id"]) == sft(TRAIN[2], min_reward=0.25)
    r = make(tenant, job_id=job_id, format="sft", split="eval")
    assert records(tenant, r.json()["id"]) == sft(EVAL[1] + EVAL[2])


def test_dpo_pairs_best_and_worst_of_groups_that_differ(tenant: httpx.Client, job_id: str) -> None:
    r = make(tenant, job_id=job_id, format="dpo")
    assert r.status_code == 201, r.text
    assert records(tenant, r.json()["id"]) == [
        {"prompt": "<s>p10", "chosen": "c100t", "rejected": "c101t"},
        # the equal groups (step 1 group 1, step 2 group 0) are skipped; of the tied best the
        # first is chosen; the chat-shaped record's prompt is its messages
        {"prompt": CHAT, "chosen": "c211t", "rejected": "c210t"},
    ]
    r = make(tenant, job_id=job_id, format="dpo", min_reward=0.95)
    assert records(tenant, r.json()["id"]) == [
        {"prompt": "<s>p10", "chosen": "c100t", "rejected": "c101t"}
    ]


def test_a_made_dataset_trains_a_job(tenant: httpx.Client, job_id: str) -> None:
    # step 1's prompts are plain text, as the tiny model (no chat template) needs
    ds = make(tenant, job_id=job_id, format="sft", steps=[1]).json()["id"]
    # its records are {prompt, completion, reward}: `em` (it reads `answer`) is refused
    refused = tenant.post("/v1/jobs", json=job_body(ds))
    assert "'answer'" in problem(refused, 422)["errors"][0]["message"]
    any_digit = {"name": "any-digit", "kind": "regex", "config": {"pattern": "[0-9]"}}
    assert tenant.post("/v1/verifiers", json=any_digit).status_code == 201
    job = make_job(tenant, ds, verifiers=[{"name": "any-digit"}])
    assert job["status"] == "queued" and job["spec"]["dataset"] == ds


def test_bad_input_names_the_field(
    any_api: RunningService, tenant: httpx.Client, job_id: str
) -> None:
    body = problem(make(tenant, job_id=job_id, format="kto"), 422)
    assert [e["path"] for e in body["errors"]] == ["$.format"]
    body = problem(make(tenant, job_id=job_id, format="sft", steps=[1, 3]), 422)
    assert [e["path"] for e in body["errors"]] == ["$.steps[1]"]
    assert "past the job's last step (2)" in body["detail"]
    body = problem(make(tenant, job_id=job_id, format="sft", steps=[0]), 422)
    assert [e["path"] for e in body["errors"]] == ["$.steps[0]"]
    body = problem(make(tenant, job_id=job_id, format="sft", min_reward=2.0), 422)
    assert [e["path"] for e in body["errors"]] == ["$.min_reward"]
    body = problem(make(tenant, job_id=job_id, format="dpo", steps=[1], split="eval"), 422)
    assert [e["path"] for e in body["errors"]] == ["$.format"]  # its one group: equal rewards
    assert "equal rewards" in body["detail"]
    bare = make_job(tenant, make_dataset(tenant, "bare"))["id"]
    body = problem(make(tenant, job_id=bare, format="sft"), 422)
    assert [e["path"] for e in body["errors"]] == ["$.job_id"]
    assert f"job '{bare}' has no stored rollouts" in body["detail"]
    many = make_job(tenant, make_dataset(tenant, "many"))["id"]  # the API's limit is 50 records
    store_rollouts(any_api, many, {"train": {1: [row(1, i // 2, i % 2, 0.5) for i in range(52)]}})
    body = problem(make(tenant, job_id=many, format="sft"), 422)
    assert [e["path"] for e in body["errors"]] == ["$.steps"] and "50 records" in body["detail"]
    assert make(tenant, job_id=many, format="dpo", steps=[1]).status_code == 422  # all equal
    r = tenant.get(f"/v1/datasets/{make_dataset(tenant)}/records", params={"after": "x"})
    assert problem(r, 422)["errors"][0]["path"] == "query.after"


def test_another_tenants_job_and_dataset_answer_as_missing(
    any_api: RunningService, tenant: httpx.Client, job_id: str
) -> None:
    ds = make(tenant, job_id=job_id, format="sft").json()["id"]
    other = tenant_client(any_api, f"other-{secrets.token_hex(4)}")
    missing_job, missing_ds = "job_" + "0" * 26, "ds_" + "0" * 26

    def same(theirs: httpx.Response, missing: httpx.Response, real: str, fake: str) -> None:
        assert theirs.status_code == missing.status_code == 404
        assert theirs.headers["content-type"] == missing.headers["content-type"]
        assert theirs.json() == {
            k: v.replace(fake, real) if isinstance(v, str) else v for k, v in missing.json().items()
        }

    same(make(other, job_id=job_id, format="sft"), make(other, job_id=missing_job, format="sft"),
         job_id, missing_job)  # fmt: skip
    same(other.get(f"/v1/datasets/{ds}/download"), other.get(f"/v1/datasets/{missing_ds}/download"),
         ds, missing_ds)  # fmt: skip
    same(other.get(f"/v1/datasets/{ds}/records"), other.get(f"/v1/datasets/{missing_ds}/records"),
         ds, missing_ds)  # fmt: skip
