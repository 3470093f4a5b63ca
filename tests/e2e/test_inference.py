"""Inference through the official `openai` SDK against the real processes of `grpo-service up`
(API, worker, serve) on the tiny model: chat and text completions, n, seeds, stop strings,
max_tokens, log-probs, streaming, and the adapters of a trained LoRA job served on one base."""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.services import TINY, RunningService, run_service
from tests.e2e.test_training_flow import wait_final

TOKEN = secrets.token_urlsafe(16)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    work = tmp_path_factory.mktemp("inference")
    env = {"GRPO_INFERENCE_TOKEN": TOKEN}
    with run_service(env, work, embedded=True, model=tiny_model_dir, serve=True) as running:
        _wait_for_serve(running)
        yield running


def _wait_for_serve(svc: RunningService, timeout_s: float = 120) -> None:
    """`up` answers as soon as its API is ready; serve, which loads torch, may come later."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ValueError, httpx.TransportError):
            if httpx.get(f"{serve_url(svc)}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"serve not ready within {timeout_s} s")


@pytest.fixture(scope="module")
def sdk(svc: RunningService) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key=svc.new_key("alice"), max_retries=0)


def serve_health(svc: RunningService) -> dict:
    """serve's own counters, read with the shared token (`up` logs where serve listens)."""
    r = httpx.get(f"{serve_url(svc)}/health", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return r.json()


# The tiny model with 8192 positions, and a cap that takes it long to reach (40 s and more on
# a CPU): a request cancelled after its first chunk stops long before it.
LONG_MODEL, LONG = "tiny-long", 8000


@pytest.fixture(scope="module")
def long_model(svc: RunningService, tmp_path_factory: pytest.TempPathFactory) -> str:
    from workers.grpo.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("long"), max_position_embeddings=8192)
    svc.add_model(LONG_MODEL, path)
    return LONG_MODEL


def serve_url(svc: RunningService) -> str:
    (url,) = re.findall(
        r"inference backend \(serve\) on (http://\S+)", (svc.log_dir / "up.log").read_text()
    )
    return url


def wait_cancelled(svc: RunningService, before: dict) -> dict:
    """serve's engine counters once it has cancelled one more request."""
    deadline, engine = time.monotonic() + 120, before
    while time.monotonic() < deadline:
        engine = serve_health(svc)["engine"]
        if engine["cancelled"] > before["cancelled"]:
            return engine
        time.sleep(0.2)
    raise AssertionError(f"no request was cancelled: {engine}\n{svc.logs()}")


@pytest.mark.parametrize(
    ("through", "path"), [("api", "/v1/completions"), ("serve", "/v1/chat/completions")]
)
def test_a_stream_whose_client_goes_away_stops_decoding(
    svc: RunningService, sdk: openai.OpenAI, long_model: str, through: str, path: str
) -> None:
    """Through the API (it closes its stream from serve) and straight to serve: decoding stops
    at once, as serve's own counters show (tokens decoded, requests cancelled)."""
    url, key = (svc.base_url, sdk.api_key) if through == "api" else (serve_url(svc), TOKEN)
    body = {"model": long_model, "max_tokens": LONG, "temperature": 0, "stream": True}
    body |= (
        {"prompt": "x"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "x"}]}
    )
    before = serve_health(svc)["engine"]
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, (r.read(), svc.logs())
        first = next(line for line in r.iter_lines() if line)
        assert first.startswith("data: {")  # then the client goes away
    after = wait_cancelled(svc, before)
    assert after["cancelled"] == before["cancelled"] + 1
    print(f"{through}: {after['tokens'] - before['tokens']} tokens decoded before the cancel")
    assert after["tokens"] - before["tokens"] < LONG // 4  # stopped well before its cap


def test_a_request_whose_client_gives_up_stops_decoding(
    svc: RunningService, sdk: openai.OpenAI, long_model: str
) -> None:
    """Not streamed: the client's read timeout closes its connection to the API, which closes
    its own to serve; serve notices and cancels."""
    before = serve_health(svc)["engine"]
    body = {"model": long_model, "prompt": "x", "max_tokens": LONG, "temperature": 0}
    headers = {"Authorization": f"Bearer {sdk.api_key}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{svc.base_url}/v1/completions", json=body, headers=headers,
                   timeout=httpx.Timeout(60, read=3))  # fmt: skip
    after = wait_cancelled(svc, before)
    print(f"{after['tokens'] - before['tokens']} tokens decoded before the cancel")
    assert after["tokens"] - before["tokens"] < LONG // 4


def test_chat_and_text_completions(sdk: openai.OpenAI) -> None:
    chat = sdk.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=5
    )
    assert chat.object == "chat.completion" and chat.model == TINY
    (choice,) = chat.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert chat.usage.prompt_tokens > 0 and 1 <= chat.usage.completion_tokens <= 5
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

    text = sdk.completions.create(model=TINY, prompt="Once", max_tokens=4, temperature=0)
    assert text.object == "text_completion" and len(text.choices) == 1
    # the random tiny model never samples EOS greedily from here: it runs to its cap
    assert text.choices[0].finish_reason == "length" and len(text.choices[0].text) == 4
    assert text.usage.completion_tokens == 4


def test_n_seed_stop_and_length(sdk: openai.OpenAI) -> None:
    two = sdk.completions.create(model=TINY, prompt="ab", max_tokens=12, n=2, seed=7)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text != two.choices[1].text  # two draws, not one copied
    again = sdk.completions.create(model=TINY, prompt="ab", max_tokens=12, n=2, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in two.choices]
    other = sdk.completions.create(model=TINY, prompt="ab", max_tokens=12, n=2, seed=8)
    assert [c.text for c in other.choices] != [c.text for c in two.choices]

    greedy = sdk.completions.create(model=TINY, prompt="ab", max_tokens=12, temperature=0)
    full = greedy.choices[0].text
    assert greedy.choices[0].finish_reason == "length"
    stop = full[5]  # a character the greedy text reaches: generation ends before it
    cut = sdk.completions.create(
        model=TINY, prompt="ab", max_tokens=12, temperature=0, stop=[stop, "never-seen"]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]


def test_logprobs(sdk: openai.OpenAI) -> None:
    chat = sdk.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "x"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == 3
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)  # greedy: the top token
    text = sdk.completions.create(model=TINY, prompt="x", max_tokens=3, logprobs=1, seed=1)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert lp.text_offset == [0, 1, 2]


def test_streaming(sdk: openai.OpenAI) -> None:
    whole = sdk.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "s"}], max_tokens=6, temperature=0
    )
    stream = sdk.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "s"}], max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)  # the SDK's iterator ends at `data: [DONE]`
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6

    parts = list(sdk.completions.create(model=TINY, prompt="s", max_tokens=5, n=2, stream=True))
    assert {p.choices[0].index for p in parts} == {0, 1}


def test_raw_stream_ends_with_done(svc: RunningService, sdk: openai.OpenAI) -> None:
    body = {"model": TINY, "prompt": "q", "max_tokens": 3, "stream": True}
    headers = {"Authorization": f"Bearer {sdk.api_key}"}
    with httpx.stream("POST", f"{svc.base_url}/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"


@pytest.fixture(scope="module")
def judged_lora_job(svc: RunningService, sdk: openai.OpenAI) -> dict:
    """One finished job for two tests (a worker run each would cost more than the tests): a
    LoRA adapter checkpointed at both of its steps, trained on a `judge` verifier on the tiny
    model, which the worker calls through serve."""
    client = svc.client(sdk.api_key)
    config = {"model": TINY, "prompt_template": "Rate the answer {{item.answer}} from 0 to 9.",
              "range": [0, 9], "max_tokens": 4}  # fmt: skip
    r = client.post("/v1/verifiers", json={"name": "rate", "kind": "judge", "config": config})
    assert r.status_code == 201, r.text
    # The tiny judge seldom answers with a number (a failed score): a second verifier that always
    # scores keeps the job from failing on verifier errors (workers/grpo/verifier_errors.py).
    regex = {"name": "any-char", "kind": "regex", "config": {"pattern": "."}}
    assert (r := client.post("/v1/verifiers", json=regex)).status_code == 201, r.text
    records = [{"prompt": f"Digit {i}:", "answer": str(i)} for i in range(2)]
    r = client.post("/v1/datasets", json={"name": "judged", "records": records})
    assert r.status_code == 201, r.text
    spec = {
        "base_model": TINY, "dataset": r.json()["id"],
        "verifiers": [{"name": "rate"}, {"name": "any-char", "weight": 0.0}],
        "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 2},
        "generation": {"max_new_tokens": 4}, "checkpoint_every": 1,
        "lora": {"r": 4, "alpha": 8},
    }  # fmt: skip
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    final = wait_final(client, r.json()["id"])
    assert final["status"] == "succeeded", (final, svc.logs())
    return final


def test_lora_checkpoints_are_served_on_one_base(
    svc: RunningService, sdk: openai.OpenAI, judged_lora_job: dict
) -> None:
    client = svc.client(sdk.api_key)
    job = judged_lora_job
    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    assert {c["format"] for c in ckpts} == {"peft-adapter"} and len(ckpts) == 2
    sdk.completions.create(model=TINY, prompt="1+1=", max_tokens=4)  # the base, loaded
    before = serve_health(svc)["pool"]
    texts = {}
    for c in ckpts:
        out = sdk.completions.create(model=c["id"], prompt="1+1=", max_tokens=4, temperature=0)
        texts[c["id"]] = out.choices[0].text
        assert out.model == c["id"]
    sdk.completions.create(model=TINY, prompt="1+1=", max_tokens=4)  # the base again
    after = serve_health(svc)["pool"]
    assert after["base_loads"] == before["base_loads"]  # no base was reloaded
    assert after["adapter_loads"] == before["adapter_loads"] + 2
    (loaded,) = [b for b in after["loaded"] if b["adapters"]]  # (tiny-long is loaded too)
    assert loaded["merged"] == [] and len(loaded["adapters"]) == 2

    stranger = openai.OpenAI(base_url=sdk.base_url, api_key=svc.new_key("bob"), max_retries=0)
    with pytest.raises(openai.NotFoundError) as theirs:
        stranger.completions.create(model=ckpts[0]["id"], prompt="x", max_tokens=2)
    with pytest.raises(openai.NotFoundError) as missing:
        stranger.completions.create(model="ckpt_0000000000000000000000", prompt="x", max_tokens=2)
    assert str(theirs.value).replace(ckpts[0]["id"], "X") == str(missing.value).replace(
        "ckpt_0000000000000000000000", "X"
    )


def test_a_reinforcement_fine_tuning_job_trains_and_its_model_answers(
    svc: RunningService, sdk: openai.OpenAI, tmp_path: Path
) -> None:
    """OpenAI's RFT path end to end (issue 18 item 2): a file and a string_check grader through
    the SDK, the job trained by the worker to success, its fine_tuned_model served by serve."""
    import io
    import json

    from workers.grpo.tiny_model import make_tiny_model

    svc.add_model("tiny-chat", make_tiny_model(tmp_path / "chat", chat_template=True))
    lines = [{"messages": [{"role": "user", "content": f"Digit {i}:"}], "answer": str(i)}
             for i in range(2)]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    train = sdk.files.create(file=("digits.jsonl", io.BytesIO(data)), purpose="fine-tune")
    grader = {"type": "string_check", "name": "digit", "input": "{{sample.output_text}}",
              "reference": "{{item.answer}}", "operation": "like"}  # fmt: skip
    hyperparameters = {"n_epochs": 1, "batch_size": 2, "compute_multiplier": 0.25}  # G = 2
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat",
        training_file=train.id,
        suffix="digits",
        seed=1,
        method={"type": "reinforcement",
                "reinforcement": {"grader": grader, "hyperparameters": hyperparameters}},
        extra_body={"generation": {"max_new_tokens": 4}},
    )  # fmt: skip
    ours = wait_final(svc.client(sdk.api_key), job.model_extra["job"], timeout=240)
    assert ours["status"] == "succeeded", (ours, svc.logs())
    done = sdk.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and ours["step"] == 1  # 2 records, 2 a step, 1 epoch
    assert done.fine_tuned_model == f"ft:tiny-chat:digits:{job.id.removeprefix('ftjob-')}"
    (ckpt, *_) = sdk.fine_tuning.jobs.checkpoints.list(job.id).data
    assert ckpt.step_number == 1 and "reward_mean" in ckpt.metrics.model_extra
    metrics = [e for e in sdk.fine_tuning.jobs.list_events(job.id) if e.type == "metrics"]
    assert len(metrics) == 1, metrics  # one a step, as OpenAI's
    assert metrics[0].data["step"] == 1 and metrics[0].data["total_steps"] == 1
    assert 0.0 <= metrics[0].data["train_reward_mean"] <= 1.0 and "train_loss" in metrics[0].data
    assert metrics[0].message.startswith("Step 1/1: train_")
    assert done.fine_tuned_model in [m.id for m in sdk.models.list()]
    chat = sdk.chat.completions.create(
        model=done.fine_tuned_model,
        messages=[{"role": "user", "content": "Digit 3:"}],
        max_completion_tokens=4,
    )
    (choice,) = chat.choices
    assert isinstance(choice.message.content, str) and chat.usage.completion_tokens >= 1
    assert chat.model == done.fine_tuned_model  # the name asked for, as OpenAI echoes it
    chunks = list(
        sdk.completions.create(model=done.fine_tuned_model, prompt="7", max_tokens=3, stream=True)
    )
    assert chunks and {c.model for c in chunks} == {done.fine_tuned_model}
    assert (
        sdk.completions.create(
            model=ckpt.fine_tuned_model_checkpoint, prompt="7", max_tokens=2
        ).model
        == ckpt.fine_tuned_model_checkpoint
    )
    assert done.trained_tokens is not None and done.trained_tokens > 0  # recorded by the worker
    assert done.estimated_finish is None  # not running


def test_a_judge_verifier_trains_and_is_cached_per_job(
    svc: RunningService, sdk: openai.OpenAI, judged_lora_job: dict
) -> None:
    """A `judge` verifier on the tiny model, called by the worker through serve: its calls are
    counted per step, an input is sent once per job, and the tiny model's garbage answers are
    each a verifier error scored 0."""
    client = svc.client(sdk.api_key)
    final = judged_lora_job
    rows = client.get(f"/v1/jobs/{final['id']}/metrics").json()["data"]
    assert [row["step"] for row in rows] == [1, 2]
    calls = sum(row["judge/rate/calls"] for row in rows)
    hits = sum(row["judge/rate/cache_hits"] for row in rows)
    assert calls == 2 and hits == 2 * 4 - 2  # one call per record, for the whole job
    assert rows[1]["judge/rate/calls"] == 0 and rows[0]["judge/rate/seconds"] > 0
    for row in rows:  # every error the judge counted is a verifier error, scored 0
        assert row["errors/rate"] == row["judge/rate/errors"]
        if row["errors/rate"] == 4:
            assert row["reward/rate"] == 0.0
