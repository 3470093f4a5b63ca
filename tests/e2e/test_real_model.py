"""GRPO on real weights through the embedded service: SmolLM2-135M-Instruct, converted from the
GGUF file a pip package ships, trains two small steps on chat-shaped records. The GGUF's chat
template and end-of-sequence token must survive the conversion: the stored rollouts show the
templated prompt, completions end at <|im_end|> or at max_new_tokens, each step records its
reward and its peak memory, within 25% of the memory plan made at submission, and the final
checkpoint loads with `from_pretrained` and answers."""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import httpx
import pytest

from tests.e2e.services import RunningService
from tests.e2e.test_training_flow import wait_final

MODEL = "smollm2-135m"
STEPS, PROMPTS, GROUP, NEW_TOKENS = 2, 2, 4, 16
# Questions with short answers: sampled at temperature 0.5, the instruct model ends most of
# its answers well before 16 tokens, which it can only do if its end-of-sequence token is the
# one the engine stops at.
QUESTIONS = [
    ("What is 2 + 3? Answer with the number only.", "5"),
    ("Is the sky blue? Answer yes or no.", "yes"),
]
ANSWER_VERIFIER = """
def verify(prompt, completion, reference, **fields):
    return 1.0 if reference[-1]["content"].lower() in completion.lower() else 0.0
"""
# The GGUF's own template adds this system turn when a conversation has none.
SYSTEM_TURN = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"


def test_grpo_on_smollm2_keeps_its_chat_template_and_eos(
    embedded_service: RunningService, smollm2_dir: Path, tmp_path: Path
) -> None:
    svc = embedded_service
    svc.add_model(MODEL, smollm2_dir)
    client = svc.client(svc.new_key("real-model"))
    model = client.get(f"/v1/models/{MODEL}").json()
    assert (model["architecture"], model["chat_template"]) == ("LlamaForCausalLM", True)
    job = wait_final(client, submit_qa_job(client))
    assert job["status"] == "succeeded", (job, svc.logs())

    rows = client.get(f"/v1/jobs/{job['id']}/rollouts", params={"limit": 100}).json()["data"]
    check_chat_rollouts(rows)
    metrics = client.get(f"/v1/jobs/{job['id']}/metrics").json()["data"]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:  # each step's reward: the mean of its completions' rewards
        step_rewards = [row["reward"] for row in rows if row["step"] == m["step"]]
        assert math.isfinite(m["reward_mean"])
        assert m["reward_mean"] == pytest.approx(sum(step_rewards) / len(step_rewards))
    # The plan (`workers/grpo/memory.py`) against the peak the run measured on real weights
    plan, peak = job["memory_estimate"]["total"], max(m["peak_memory_bytes"] for m in metrics)
    assert 0.75 <= plan / peak <= 1.25, (job["memory_estimate"], peak)
    check_final_checkpoint_answers(client, job["id"], tmp_path / "ckpt")


def submit_qa_job(client: httpx.Client) -> str:
    """The questions as chat-shaped records (the answer is the reference turn), a verifier that
    looks for it, and a job of STEPS steps on MODEL; the job's id."""
    verifier = {"name": "answer", "kind": "python", "config": {"source": ANSWER_VERIFIER}}
    assert client.post("/v1/verifiers", json=verifier).status_code == 201
    records = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in QUESTIONS
    ]
    jsonl = "".join(json.dumps(r) + "\n" for r in records).encode()
    r = client.post("/v1/datasets", data={"name": "qa"}, files={"file": ("qa.jsonl", jsonl)})
    assert r.status_code == 201, r.text
    grpo = {"steps": STEPS, "prompts_per_step": PROMPTS, "group_size": GROUP, "beta": 0.0}
    r = client.post("/v1/jobs", json={
        "base_model": MODEL, "dataset": r.json()["id"], "verifiers": [{"name": "answer"}],
        "grpo": {**grpo, "learning_rate": 1e-6}, "checkpoint_every": STEPS,
        "generation": {"max_new_tokens": NEW_TOKENS, "temperature": 0.5},
    })  # fmt: skip
    assert r.status_code == 201, r.text
    return r.json()["id"]


def check_chat_rollouts(rows: list[dict]) -> None:
    """Every prompt rendered by the GGUF's template; every completion ended at EOS or cut at
    max_new_tokens, and enough of them at EOS."""
    assert len(rows) == STEPS * PROMPTS * GROUP
    for row in rows:
        question = row["messages"][-1]["content"]
        assert row["prompt"].startswith(SYSTEM_TURN), row["prompt"]
        turn = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        assert row["prompt"].endswith(turn), row["prompt"]
        assert "<|im_" not in row["completion"]  # no special token, no turn run past the end
        if row["truncated"]:
            assert (row["finish_reason"], row["length"]) == ("length", NEW_TOKENS)
        else:
            assert row["finish_reason"] == "stop" and 0 < row["length"] <= NEW_TOKENS
    stopped = sum(row["finish_reason"] == "stop" for row in rows)
    assert stopped >= len(rows) // 4, [row["completion"] for row in rows]


def check_final_checkpoint_answers(client: httpx.Client, job_id: str, out: Path) -> None:
    ckpts = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["data"]
    assert [(c["step"], c["format"]) for c in ckpts] == [(STEPS, "full")]
    r = client.get(f"/v1/jobs/{job_id}/checkpoints/latest/download")
    assert r.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        tar.extractall(out, filter="data")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>"
    messages = [{"role": "user", "content": QUESTIONS[0][0]}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    generated = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    new_tokens = generated[0, inputs["input_ids"].shape[1] :]
    answer = tokenizer.decode(new_tokens, skip_special_tokens=True)
    assert answer.strip(), tokenizer.decode(generated[0])
