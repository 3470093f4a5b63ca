"""The model catalog through the API: `/v1/models`, and every refusal of a job's base model
and of a spec its model cannot run, at submission (no worker involved), on SQLite and
PostgreSQL."""

from __future__ import annotations

import ast
import secrets
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Checkpoint
from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, job_body, make_dataset, make_job, make_verifier, problem
from tests.api.server import SHARDED_QUEUE, SMALL_DEVICE_QUEUE, settings_of
from tests.e2e.services import CLI, TINY, RunningService


def seed_checkpoint(svc: RunningService, job_id: str, fmt: str = "full") -> str:
    """A checkpoint row of `job_id`, as a worker would commit it."""
    settings = settings_of(svc)
    engine = make_engine(settings.effective_database_url)
    ckpt_id = new_id("ckpt")
    with Session(engine) as s, s.begin():
        s.add(
            Checkpoint(
                id=ckpt_id, job_id=job_id, step=2, epoch=1, object_key=f"x/{ckpt_id}.tar",
                size_bytes=10, sha256="0" * 64, format=fmt,
            )
        )  # fmt: skip
    engine.dispose()
    return ckpt_id


def test_models_lists_the_catalog_openai_shaped(any_api: RunningService) -> None:
    with tenant_client(any_api) as client:
        body = client.get("/v1/models").json()
        assert body["object"] == "list"
        tiny = next(m for m in body["data"] if m["id"] == TINY)
        assert tiny["object"] == "model" and tiny["owned_by"] == "system"
        assert isinstance(tiny["created"], int) and tiny["kind"] == "base"
        assert tiny["architecture"] == "LlamaForCausalLM"
        assert tiny["num_parameters"] == 2_649_344 and tiny["context_length"] == 1024
        assert tiny["chat_template"] is False and len(tiny["revision"]) == 64
        assert client.get(f"/v1/models/{TINY}").json() == tiny
        problem(client.get("/v1/models/no-such-model"), 404)
        problem(client.get("/v1/models/ckpt_0123456789abcdef"), 404)
        assert client.get("/v1/models", headers={"Authorization": ""}).status_code == 401


def test_a_tenants_checkpoints_are_its_models_and_nobody_elses(any_api: RunningService) -> None:
    with tenant_client(any_api) as owner, tenant_client(any_api) as other:
        make_verifier(owner)
        job = make_job(owner, make_dataset(owner))
        ckpt = seed_checkpoint(any_api, job["id"])
        listed = {m["id"]: m for m in owner.get("/v1/models").json()["data"]}
        assert listed[ckpt]["kind"] == "checkpoint" and listed[ckpt]["root"] == TINY
        assert listed[ckpt]["job"] == job["id"] and listed[ckpt]["step"] == 2
        assert owner.get(f"/v1/models/{ckpt}").json()["id"] == ckpt
        assert ckpt not in {m["id"] for m in other.get("/v1/models").json()["data"]}
        foreign = other.get(f"/v1/models/{ckpt}")
        missing = other.get("/v1/models/ckpt_ffffffffffffffff")
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json()["title"] == missing.json()["title"]


def _base_model_message(client: httpx.Client, ds: str, value: str) -> str:
    r = client.post("/v1/jobs", json=job_body(ds, base_model=value))
    problem(r, 422)
    assert error_paths(r) == ["$.base_model"], r.text
    (error,) = r.json()["errors"]
    shown, rest = error["message"].split(" is neither", 1)
    # The value quoted back, cut to 80 characters (a long path: its start and "...")
    assert value.startswith(ast.literal_eval(shown).removesuffix("...")), error["message"]
    return "<value> is neither" + rest


def test_base_model_is_a_catalog_name_or_an_own_checkpoint_nothing_else(
    any_api: RunningService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with tenant_client(any_api) as client, tenant_client(any_api) as other:
        make_verifier(client)
        ds = make_dataset(client)
        make_verifier(other)
        foreign = seed_checkpoint(any_api, make_job(other, make_dataset(other))["id"])
        refused = [
            str(tiny_model_dir),  # a directory that exists on the server, holding a model
            str(tmp_path / "no-such-dir"),  # one that does not
            "/etc", "/etc/passwd", "../../etc", "./tiny", "tiny/../tiny", "~/models",
            "file:///etc/passwd", "s3://bucket/model", "https://example.com/model",
            "gpt2", "Qwen/Qwen2.5-0.5B", "tiny ", "TINY",
            foreign,  # another tenant's checkpoint
            "ckpt_ffffffffffffffff",  # a missing one
        ]  # fmt: skip
        messages = {_base_model_message(client, ds, value) for value in refused}
        # One message for every case: nothing tells what exists, where, or whose. A string
        # close to a catalog name (which every tenant lists) adds "did you mean" it.
        hint = f": did you mean '{TINY}'?"
        assert {m for m in messages if m.endswith(hint)}, messages  # `TINY`, `tiny ` ...
        assert len({m.removesuffix(hint) for m in messages}) == 1, messages
        assert "GET /v1/models" in messages.pop()
        assert client.get("/v1/jobs").json()["data"] == []  # nothing stored


def test_fine_tuning_from_an_own_checkpoint_records_the_lineage(api: RunningService) -> None:
    with tenant_client(api) as client:
        make_verifier(client)
        ds = make_dataset(client)
        parent = make_job(client, ds)
        ckpt = seed_checkpoint(api, parent["id"])
        child = make_job(client, ds, base_model=ckpt)
        assert child["parent_checkpoint"] == ckpt and child["spec"]["base_model"] == ckpt
        assert child["spec"]["lineage"] == [ckpt]
        assert client.get(f"/v1/jobs/{child['id']}").json()["parent_checkpoint"] == ckpt
        assert parent["parent_checkpoint"] is None
        # An adapter's lineage reaches down to the weights it was trained on.
        adapter = seed_checkpoint(api, child["id"], fmt="peft-adapter")
        grandchild = make_job(client, ds, base_model=adapter)
        assert grandchild["spec"]["lineage"] == [adapter, ckpt]


def test_a_model_is_removed_only_without_live_jobs_then_its_checkpoints_are_refused(
    api: RunningService, client: httpx.Client, tiny_model_dir: Path
) -> None:
    name = f"tiny-rm-{secrets.token_hex(4)}"
    api.add_model(name, tiny_model_dir)
    assert name in api.cli("models", "list")
    make_verifier(client)
    job = make_job(client, make_dataset(client), base_model=name)
    refused = subprocess.run(
        [*CLI, "models", "remove", name], env=api.env, capture_output=True, text=True, timeout=120
    )
    message = " ".join(refused.stderr.split())  # unwrapped
    assert refused.returncode == 2 and f"is the base of live job {job['id']}" in message
    assert client.get(f"/v1/models/{name}").status_code == 200
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    ckpt = seed_checkpoint(api, job["id"])
    api.cli("models", "remove", name)
    problem(client.get(f"/v1/models/{name}"), 404)
    r = client.post("/v1/jobs", json=job_body(make_dataset(client), base_model=ckpt))
    problem(r, 422)
    assert error_paths(r) == ["$.base_model"] and "the catalog no longer has" in r.text


def test_a_checkpoint_on_too_many_adapters_is_refused(
    api: RunningService, client: httpx.Client
) -> None:
    """Each adapter is merged in turn when a job loads: a lineage of 32 is the most."""
    make_verifier(client)
    ds = make_dataset(client)
    base = TINY
    for depth in range(33):  # job k starts from adapter k-1: its lineage holds k checkpoints
        job = make_job(client, ds, base_model=base, lora={"r": 4})
        assert len(job["spec"]["lineage"]) == depth
        assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202  # open-job cap
        base = seed_checkpoint(api, job["id"], fmt="peft-adapter")
    r = client.post("/v1/jobs", json=job_body(ds, base_model=base, lora={"r": 4}))
    problem(r, 422)
    assert error_paths(r) == ["$.base_model"] and "sits on 32 adapters; at most 31" in r.text


def test_a_queue_the_service_does_not_run_is_refused(client: httpx.Client) -> None:
    make_verifier(client)
    r = client.post("/v1/jobs", json=job_body(make_dataset(client), queue="gpu-h100-nowhere"))
    problem(r, 422)
    assert error_paths(r) == ["$.queue"] and "gpu-h100-nowhere" in r.text


@pytest.mark.parametrize(
    ("targets", "paths"),
    [
        (["q_proj", "v_proj"], []),
        ("all-linear", []),
        (r"model\.layers\.\d+\.self_attn\.(q|v)_proj", []),
        (["q_proj", "c_attn", "query_key_value"], ["$.lora.target_modules[1]",
                                                   "$.lora.target_modules[2]"]),
        (r"transformer\.h\.\d+\.attn", ["$.lora.target_modules"]),
        ("(unclosed", ["$.lora.target_modules"]),
    ],
)  # fmt: skip
def test_lora_target_modules_must_exist_in_the_architecture(
    client: httpx.Client, targets: str | list[str], paths: list[str]
) -> None:
    make_verifier(client)
    lora = {"r": 4, "target_modules": targets}
    r = client.post("/v1/jobs", json=job_body(make_dataset(client), lora=lora))
    if not paths:
        assert r.status_code == 201, r.text
        return
    problem(r, 422)
    assert error_paths(r) == paths
    # the message lists what the architecture has, or why the pattern is none
    assert "q_proj" in r.text or "not a regular expression: missing )" in r.text


def test_prompt_plus_max_new_tokens_must_fit_the_context(client: httpx.Client) -> None:
    """The tiny model's tokenizer is one token per character plus <bos>: a 1000-character
    prompt is 1001 tokens, counted with the model's own tokenizer; its context is 1024."""
    make_verifier(client)
    records = [{"prompt": "x" * 1000, "answer": "1"}, {"prompt": "short", "answer": "2"}]
    ds = client.post("/v1/datasets", json={"name": "long", "records": records}).json()["id"]
    r = client.post("/v1/jobs", json=job_body(ds, generation={"max_new_tokens": 24}))
    problem(r, 422)
    assert error_paths(r) == ["$.generation.max_new_tokens"]
    assert "1001 tokens" in r.text and "(1024)" in r.text
    r = client.post("/v1/jobs", json=job_body(ds, generation={"max_new_tokens": 23}))
    assert r.status_code == 201, r.text
    # the eval dataset is held to the same bound
    short = make_dataset(client, "short")
    body = job_body(short, eval_dataset=ds, generation={"max_new_tokens": 100})
    assert error_paths(client.post("/v1/jobs", json=body)) == ["$.generation.max_new_tokens"]


def test_a_packed_micro_batch_must_hold_the_longest_sequence(client: httpx.Client) -> None:
    """micro_batch_tokens >= the longest prompt (41 tokens: 40 characters and <bos>) +
    max_new_tokens, checked with the model's own tokenizer; and it excludes micro_batch_size."""
    make_verifier(client)
    records = [{"prompt": "x" * 40, "answer": "1"}, {"prompt": "short", "answer": "2"}]
    ds = client.post("/v1/datasets", json={"name": "packed", "records": records}).json()["id"]
    grpo = {"steps": 2, "prompts_per_step": 1, "group_size": 2}
    generation = {"max_new_tokens": 24}
    body = job_body(ds, grpo=grpo | {"micro_batch_tokens": 64}, generation=generation)
    r = client.post("/v1/jobs", json=body)
    problem(r, 422)
    assert error_paths(r) == ["$.grpo.micro_batch_tokens"]
    assert "41 tokens" in r.text and "= 65" in r.text
    body = job_body(ds, grpo=grpo | {"micro_batch_tokens": 65}, generation=generation)
    assert client.post("/v1/jobs", json=body).status_code == 201
    both = grpo | {"micro_batch_tokens": 65, "micro_batch_size": 2}
    r = client.post("/v1/jobs", json=job_body(ds, grpo=both, generation=generation))
    assert error_paths(r) == ["$.grpo.micro_batch_tokens"] and "not both" in r.text


def test_chat_prompts_need_a_chat_template(
    api: RunningService, client: httpx.Client, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from workers.grpo.text import encode_prompts
    from workers.grpo.tiny_model import make_tiny_model

    make_verifier(client)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "y" * 900}]
    records = [{"prompt": messages, "answer": "1"}]
    ds = client.post("/v1/datasets", json={"name": "chat", "records": records}).json()["id"]
    r = client.post("/v1/jobs", json=job_body(ds, generation={"max_new_tokens": 8}))
    problem(r, 422)
    assert error_paths(r) == ["$.dataset"] and "chat template" in r.text

    chat_dir = make_tiny_model(tmp_path / "chat", chat_template=True)
    name = f"tiny-chat-{tmp_path.name[-8:]}"
    api.add_model(name, chat_dir)
    # the API's count (tokenizers + its own Jinja) equals the engine's (transformers)
    _, mask = encode_prompts(AutoTokenizer.from_pretrained(chat_dir), [messages])
    tokens = int(mask.sum())
    fits = {"max_new_tokens": 1024 - tokens}
    r = client.post("/v1/jobs", json=job_body(ds, base_model=name, generation=fits))
    assert r.status_code == 201, r.text
    over = {"max_new_tokens": 1025 - tokens}
    r = client.post("/v1/jobs", json=job_body(ds, base_model=name, generation=over))
    assert error_paths(r) == ["$.generation.max_new_tokens"] and f"{tokens} tokens" in r.text


def test_the_memory_plan_is_shown_and_a_job_over_the_device_is_refused(
    client: httpx.Client,
) -> None:
    make_verifier(client)
    ds = make_dataset(client)
    job = make_job(client, ds)
    plan = job["memory_estimate"]
    parts = {"weights", "workspace", "optimizer", "reference", "kv_cache", "decode_record"}
    parts |= {"activations"}
    assert set(plan) == parts | {"total"} and plan["total"] == sum(plan[p] for p in parts)
    assert plan["weights"] == 2 * 2_649_344 * 4  # fp32 weights and the decode's packed copy
    assert client.get(f"/v1/jobs/{job['id']}").json()["memory_estimate"] == plan
    lora = make_job(client, ds, lora={"r": 8})
    assert lora["memory_estimate"]["reference"] == 0  # the adapter off is the reference
    assert lora["memory_estimate"]["optimizer"] < plan["optimizer"] / 10
    r = client.post("/v1/jobs", json=job_body(ds, queue=SMALL_DEVICE_QUEUE))
    problem(r, 422)
    assert error_paths(r) == ["$.queue"]
    assert "estimated peak memory" in r.text and "0.0625 GiB" in r.text


def test_the_memory_plan_is_per_device_when_the_job_is_sharded(client: httpx.Client) -> None:
    """On N devices (FSDP2) the plan is one rank's: a job over a device on one fits on two."""
    make_verifier(client)
    ds = make_dataset(client, n=4)
    grpo = {"steps": 2, "prompts_per_step": 4, "group_size": 8}
    extra: dict[str, Any] = {"grpo": grpo, "generation": {"max_new_tokens": 64}}
    extra["queue"] = SHARDED_QUEUE
    body = job_body(ds, **extra)
    # On one device through the model's own forward, as N ranks run: the parts compare.
    own = job_body(ds, **{**extra, "grpo": {**grpo, "engine": "reference"}})
    r = client.post("/v1/jobs", json=own)
    problem(r, 422)
    assert error_paths(r) == ["$.queue"] and "per device" not in r.text
    message = r.json()["errors"][0]["message"]
    assert "exceeds the 0.3125 GiB of a device" in message and "resources.devices" in message
    one = _parts_gib(message)
    plans = {}
    for n in (2, 4):
        job = make_job(client, ds, **extra, resources={"devices": n})
        plans[n] = job["memory_estimate"]
        assert plans[n]["total"] <= 5 / 16 * 2**30 < one["total"] * 2**30
        client.post(f"/v1/jobs/{job['id']}/cancel")
    # Sharded 1/N: the optimizer state; the shard beside the weights gathered to decode; the
    # rank's P/N prompts' KV cache and activations. The reference copy is whole on each.
    for n, plan in plans.items():
        gib = {k: v / 2**30 for k, v in plan.items()}
        assert abs(gib["optimizer"] - one["optimizer"] / n) < 0.01
        assert abs(gib["weights"] - one["weights"] * (1 + 1 / n)) < 0.01
        assert abs(gib["kv_cache"] - one["kv_cache"] / n) < 0.01
        assert abs(gib["activations"] - one["activations"] / n) < 0.01
        assert abs(gib["reference"] - one["reference"]) < 0.01 and one["reference"] > 0
    # Over a device even on two: the message says the parts are per device.
    over = {**body, "generation": {"max_new_tokens": 160}, "resources": {"devices": 2}}
    r = client.post("/v1/jobs", json=over)
    problem(r, 422)
    assert "GiB per device on 2 devices (weights" in r.text, r.text
    two = _parts_gib(r.json()["errors"][0]["message"])
    assert abs(two["optimizer"] - one["optimizer"] / 2) < 0.01


def _parts_gib(message: str) -> dict[str, float]:
    """The parts a memory refusal lists, in GiB ("... GiB (weights 0.02, workspace 0.08, ...)")."""
    total = float(message.split("estimated peak memory ", 1)[1].split(" GiB", 1)[0])
    listed = message.split("(", 1)[1].split(")", 1)[0]
    parts = {k: float(v) for k, v in (p.rsplit(" ", 1) for p in listed.split(", "))}
    return {**parts, "total": total}
