"""problem+json on every error, with the JSON path of every bad field; limits."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, job_body, make_dataset, make_job, make_verifier, problem
from tests.e2e.services import RunningService


def test_framework_errors_are_problems(api: RunningService, client: httpx.Client) -> None:
    problem(client.get("/v1/nowhere"), 404)
    r = client.delete("/v1/jobs")
    assert problem(r, 405) and "POST" in r.headers["allow"]
    problem(api.client(None).get("/v1/jobs"), 401)
    problem(api.client("grpo_sk_" + secrets.token_urlsafe(32)).get("/v1/jobs"), 401)
    r = client.post("/v1/jobs", content=b"{", headers={"content-type": "application/json"})
    assert error_paths(r) == ["$"] and problem(r, 422)


def test_every_bad_field_is_listed_with_its_path(client: httpx.Client) -> None:
    body = {
        "base_model": "",
        "dataset": "ds_x",
        "verifiers": [{"name": "a", "version": 0}, {"weight": "heavy"}],
        "grpo": {"steps": 0, "max_off_policy_steps": 9, "importance_sampling_cap": 0.5},
        "generation": {"temperature": "hot"},
        "queue": "no spaces",
    }
    r = client.post("/v1/jobs", json=body)
    problem(r, 422)
    assert set(error_paths(r)) >= {
        "$.base_model",
        "$.verifiers[0].version",
        "$.verifiers[1].name",
        "$.verifiers[1].weight",
        "$.grpo.steps",
        "$.grpo.max_off_policy_steps",
        "$.grpo.importance_sampling_cap",
        "$.generation.temperature",
        "$.queue",
    }
    r = client.get("/v1/jobs?limit=0&status=bogus")
    assert set(error_paths(problem(r, 422) and r)) == {"query.limit", "query.status"}


def test_a_spec_the_engine_would_refuse_is_refused_at_submission(client: httpx.Client) -> None:
    """The request model is the engine's TrainSpec: its validators run before anything is stored."""
    make_verifier(client)
    ds = make_dataset(client, "mb")
    grpo = {"steps": 2, "prompts_per_step": 2, "group_size": 8, "micro_batch_size": 3}
    r = client.post("/v1/jobs", json=job_body(ds, grpo=grpo))
    problem(r, 422)
    assert error_paths(r) == ["$.grpo.micro_batch_size"]
    assert "must divide prompts_per_step * group_size = 16" in r.json()["detail"]
    assert client.get("/v1/jobs").json()["data"] == []  # nothing stored
    r = client.post("/v1/jobs", json=job_body(ds, grpo={**grpo, "micro_batch_size": 4}))
    assert r.status_code == 201, r.text


def test_non_finite_and_out_of_range_numbers_are_refused(client: httpx.Client) -> None:
    body = (
        '{"base_model": "m", "dataset": "ds_x", "queue": "q",'
        ' "verifiers": [{"name": "a", "weight": Infinity, "version": 1180591620717411303424}],'
        ' "grpo": {"beta": NaN, "max_grad_norm": Infinity, "clip_epsilon_high": -Infinity,'
        ' "seed": 1180591620717411303424, "weight_decay": 1e308},'
        ' "generation": {"top_k": 1000000000, "stop": ["' + "x" * 5000 + '"]},'
        ' "lora": {"alpha": Infinity}}'
    )
    r = client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    problem(r, 422)
    assert set(error_paths(r)) == {
        "$.verifiers[0].weight", "$.verifiers[0].version", "$.grpo.beta", "$.grpo.max_grad_norm",
        "$.grpo.clip_epsilon_high", "$.grpo.seed", "$.grpo.weight_decay", "$.generation.top_k",
        "$.generation.stop[0]", "$.lora.alpha",
    }  # fmt: skip


def test_spec_strings_and_lists_are_capped(client: httpx.Client) -> None:
    body = {
        "base_model": "m" * 1001, "dataset": "d" * 201, "eval_dataset": "d" * 201,
        "verifiers": [{"name": "v" * 201}], "eval_verifiers": [{"name": "a"}] * 17,
        "generation": {"stop": ["s"] * 17}, "lora": {"target_modules": ["q"] * 65},
    }  # fmt: skip
    r = client.post("/v1/jobs", json=body)
    problem(r, 422)
    assert set(error_paths(r)) == {
        "$.base_model", "$.dataset", "$.eval_dataset", "$.verifiers[0].name",
        "$.eval_verifiers", "$.generation.stop", "$.lora.target_modules",
    }  # fmt: skip


def test_body_limit_counts_streamed_bytes(api_http: RunningService) -> None:
    """Over HTTP: a body without Content-Length reaches the app in the chunks it was sent in
    (the in-process transport hands it over whole)."""
    client = tenant_client(api_http)
    big = b'{"name": "x", "records": [' + b'{"prompt": "aaaaaaaaaa"},' * 60_000 + b"]}"
    problem(
        client.post("/v1/datasets", content=big, headers={"content-type": "application/json"}), 413
    )

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"name": "x", "records": ['
        for _ in range(60_000):
            yield b'{"prompt": "aaaaaaaaaa"},'
        yield b"]}"

    r = client.post("/v1/datasets", content=chunked(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert "limit" in problem(r, 413)["detail"]


def test_dataset_limits(client: httpx.Client) -> None:
    r = client.post("/v1/datasets", json={"name": "x", "records": [{"prompt": "p"}] * 51})
    assert error_paths(problem(r, 422) and r) == ["$.records"]
    jsonl = b'{"prompt": "ok"}\n' + b'{"prompt": "' + b"a" * 3000 + b'"}\n{"prompt": "ok"}\n'
    r = client.post("/v1/datasets", data={"name": "x"}, files={"file": ("d.jsonl", jsonl)})
    assert error_paths(problem(r, 422) and r) == ["$.file.line[2]"]
    many = b'{"prompt": "ok"}\n' * 51
    r = client.post("/v1/datasets", data={"name": "x"}, files={"file": ("d.jsonl", many)})
    assert "more than 50" in problem(r, 422)["detail"]
    r = client.post("/v1/datasets", files={"name": (None, "x"), "file": (None, "not a file")})
    assert error_paths(problem(r, 422) and r) == ["$.file"]
    r = client.post(
        "/v1/datasets", content=b"\xff\xfe", headers={"content-type": "application/json"}
    )
    problem(r, 422)


def test_verifier_source_is_limited_to_256_kb(client: httpx.Client) -> None:
    source = "def verify(prompt, completion, **kw):\n    return 1.0\n" + "#" * (260 * 1024) + "\n"
    r = client.post(
        "/v1/verifiers", json={"name": "huge", "kind": "python", "config": {"source": source}}
    )
    assert error_paths(problem(r, 422) and r) == ["$.config.source"]
    assert "256" in r.json()["detail"]


def test_open_jobs_per_tenant_answer_429_with_retry_after(client: httpx.Client) -> None:
    make_verifier(client)
    dataset = make_dataset(client)
    jobs = [make_job(client, dataset) for _ in range(3)]
    r = client.post("/v1/jobs", json=job_body(dataset))
    assert "limit is 3" in problem(r, 429)["detail"] and r.headers["retry-after"] == "7"
    assert client.post(f"/v1/jobs/{jobs[0]['id']}/cancel").status_code == 202
    make_job(client, dataset)  # a finished job frees its slot
