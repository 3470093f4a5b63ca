"""Bad input gets a clear problem+json naming the field; failures at training time are visible."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import submit_digit_job, wait_final

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def client(embedded_service: RunningService) -> httpx.Client:
    return embedded_service.client(embedded_service.new_key("bad-input"))


def paths(r: httpx.Response) -> list[str]:
    assert r.headers["content-type"].startswith(PROBLEM), r.text
    body = r.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    return [e["path"] for e in body.get("errors", [])]


def _dataset(client: httpx.Client) -> str:
    records = [{"prompt": "Digit 1:", "answer": "1"}]  # the field `em` compares with
    r = client.post("/v1/datasets", json={"name": "d", "records": records})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_job_with_missing_dataset_and_verifier_names_both(client: httpx.Client) -> None:
    r = client.post(
        "/v1/jobs",
        json={"base_model": "m", "dataset": "ds_nope", "verifiers": [{"name": "ghost"}]},
    )
    assert r.status_code == 422
    assert paths(r) == ["$.base_model", "$.dataset", "$.verifiers[0].name"]
    assert "ds_nope" in r.json()["detail"] and "ghost" in r.json()["detail"]


def test_job_with_bad_knobs_lists_every_field(client: httpx.Client) -> None:
    body = {
        "base_model": "m",
        "dataset": _dataset(client),
        "verifiers": [{"name": "x"}],
        "grpo": {"group_size": 1, "std": "weird", "bogus": 1},
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 422
    assert set(paths(r)) == {"$.grpo.group_size", "$.grpo.std", "$.grpo.bogus"}


def test_malformed_jsonl_line_is_named(client: httpx.Client) -> None:
    jsonl = '{"prompt": "ok"}\n{"prompt": \n{"answer": 3}\n'
    r = client.post(
        "/v1/datasets", data={"name": "broken"}, files={"file": ("d.jsonl", jsonl.encode())}
    )
    assert r.status_code == 422
    assert paths(r) == ["$.file.line[2]", "$.file.line[3].prompt"]
    assert "line 2" in r.json()["detail"] and "line 3" in r.json()["detail"]
    listed = client.get("/v1/datasets").json()["data"]
    assert all(d["name"] != "broken" for d in listed)  # nothing half-stored


def test_json_dataset_records_are_validated(client: httpx.Client) -> None:
    r = client.post("/v1/datasets", json={"name": "x", "records": [{"prompt": "a"}, {"q": 1}]})
    assert r.status_code == 422 and paths(r) == ["$.records[1].prompt"]
    r = client.post(
        "/v1/datasets", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422


def test_python_verifier_that_does_not_compile_is_refused(client: httpx.Client) -> None:
    r = client.post(
        "/v1/verifiers",
        json={"name": "broken", "kind": "python", "config": {"source": "def verify(:\n"}},
    )
    assert r.status_code == 422
    assert paths(r) == ["$.config.source"]
    assert "SyntaxError" in r.json()["detail"]
    assert client.get("/v1/verifiers/broken").status_code == 404


def test_verifier_versions_are_immutable_and_numbered(client: httpx.Client) -> None:
    for answer in ("a", "b"):
        r = client.post(
            "/v1/verifiers",
            json={
                "name": "em",
                "kind": "exact_match",
                "config": {"field": "answer"},
                "description": answer,
            },
        )
        assert r.status_code == 201, r.text
    assert client.get("/v1/verifiers/em").json()["version"] == 2
    assert client.get("/v1/verifiers/em/versions/1").json()["description"] == "a"
    r = client.post(
        "/v1/verifiers/em/test",
        json={
            "version": 1,
            "samples": [
                {"prompt": "p", "completion": "42", "answer": "42"},
                {"prompt": "p", "completion": "41", "answer": "42"},
            ],
        },
    )
    assert r.status_code == 200 and r.json()["scores"] == [1.0, 0.0]


def test_unknown_routes_and_bad_json_are_problems(client: httpx.Client) -> None:
    r = client.post("/v1/jobs", content=b"[", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM)
    assert client.get("/v1/jobs?limit=500").status_code == 422
    assert client.get("/v1/jobs/job_missing").status_code == 404


def test_a_catalog_model_gone_from_disk_fails_the_job_with_reason(
    embedded_service: RunningService, client: httpx.Client, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The operator registered a directory, then deleted it: the worker names the model (the
    tenant's word for it) and the job fails with a code."""
    copy = shutil.copytree(tiny_model_dir, tmp_path / "soon-gone")
    embedded_service.add_model("soon-gone", copy)
    shutil.rmtree(copy)
    job = submit_digit_job(client, "soon-gone")
    final = wait_final(client, job["id"], timeout=120)
    assert final["status"] == "failed", final
    assert "cannot load base_model 'soon-gone'" in final["error"]["message"], final["error"]
    assert final["error"]["code"] == "model_load_error"


def _train_with(
    client: httpx.Client, verifier: str, source: str, records: list[dict], steps: int, prompts: int
) -> dict:
    """A python verifier of `source` and a dataset of `records`, trained on (G = 2, 4 new
    tokens) to its end: the final job."""
    body = {"name": verifier, "kind": "python", "config": {"source": source}}
    assert (r := client.post("/v1/verifiers", json=body)).status_code == 201, r.text
    ds = client.post("/v1/datasets", json={"name": verifier, "records": records}).json()["id"]
    grpo = {"steps": steps, "prompts_per_step": prompts, "group_size": 2}
    r = client.post("/v1/jobs", json={"base_model": TINY, "dataset": ds, "grpo": grpo,
                                      "verifiers": [{"name": verifier}],
                                      "generation": {"max_new_tokens": 4}})  # fmt: skip
    assert r.status_code == 201, r.text
    return wait_final(client, r.json()["id"], timeout=200)


def test_verifier_that_raises_is_counted_not_fatal(client: httpx.Client) -> None:
    source = (
        "def verify(prompt, completion, digit, **kw):\n"
        "    if digit % 2:\n"
        "        raise ValueError('odd digits are not supported')\n"
        "    return 1.0\n"
    )
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in (1, 2, 3, 4)]
    final = _train_with(client, "flaky", source, records, steps=2, prompts=4)
    assert final["status"] == "succeeded", final
    rows = client.get(f"/v1/jobs/{final['id']}/metrics").json()["data"]
    assert sum(row["errors/flaky"] for row in rows) == 2 * 2 * 2  # 2 odd prompts x G=2 x 2 steps
    events = client.get(f"/v1/jobs/{final['id']}/events").json()["data"]
    warned = [e for e in events if e["type"] == "warning"
              and e["data"].get("reason") == "verifier_errors"]  # fmt: skip
    assert len(warned) == 1, events  # half the scores failed: said once, not fatal
    assert "odd digits are not supported" in warned[0]["message"]


def test_a_verifier_that_fails_on_every_completion_fails_the_job(client: httpx.Client) -> None:
    # It reads a field the records have (one they lack is refused at submission:
    # tests/api/test_verifier_fields.py) and fails on every completion all the same.
    source = "def verify(prompt, completion, target):\n    return float(target) / 0\n"
    records = [{"prompt": f"Digit {d}:", "target": str(d)} for d in (1, 2)]
    final = _train_with(client, "divides-by-zero", source, records, steps=5, prompts=2)
    assert final["status"] == "failed" and final["error"]["code"] == "verifier_errors", final
    message = final["error"]["message"]
    assert "step 1: every score failed" in message and "ZeroDivisionError" in message, message
    assert "verifier 'divides-by-zero'" in message and "on the completion" in message


def test_auth(embedded_service: RunningService, client: httpx.Client, tiny_model_dir: Path) -> None:
    anonymous = embedded_service.client(None)
    r = anonymous.get("/v1/jobs")
    assert r.status_code == 401 and r.headers["content-type"].startswith(PROBLEM)
    assert embedded_service.client("grpo_sk_wrong").get("/v1/jobs").status_code == 401

    ds = _dataset(client)
    other = embedded_service.client(embedded_service.new_key("someone-else"))
    assert other.get(f"/v1/datasets/{ds}").status_code == 404
    assert other.get("/v1/datasets").json()["data"] == []
    r = client.post(
        "/v1/jobs",
        json={"base_model": TINY, "dataset": ds, "verifiers": [{"name": "em"}]},
    )
    job_id = r.json()["id"]
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/metrics", f"/v1/jobs/{job_id}/events"):
        other_r, missing_r = other.get(path), other.get(path.replace(job_id, "job_00000000"))
        assert other_r.status_code == missing_r.status_code == 404
        assert json.loads(other_r.text)["title"] == json.loads(missing_r.text)["title"]
    assert other.post(f"/v1/jobs/{job_id}/cancel").status_code == 404
    # the job used dataset ds while live: it cannot be deleted until it ends
    status = client.get(f"/v1/jobs/{job_id}").json()["status"]
    assert status in ("queued", "running"), status
    assert client.delete(f"/v1/datasets/{ds}").status_code == 409
    # free the one worker of the embedded service for the tests after this one
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    assert wait_final(client, job_id, timeout=120)["status"] == "cancelled"
