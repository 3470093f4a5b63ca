"""Model judges (issue 18 items 3-4) against the tiny model in a real `grpo-service serve`: a
score_model and a label_model grader through the official SDK's graders.run, a `judge`
verifier's /test, garbage answers scored 0 with the error, identical inputs and cached ones not
sent again (serve's own request counter), and every URL in a judge's config refused."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography.fernet import Fernet

from service.supervisor import serve_command
from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.api.server import run_api
from tests.api.test_models import seed_checkpoint
from tests.e2e.services import TINY, RunningService, free_port
from workers.verifiers import JudgeContext, JudgeEndpoint, open_verifier
from workers.verifiers.judge_answers import JudgeAnswerError, parse_score

TOKEN = secrets.token_urlsafe(16)
SAMPLE = "The answer is 4."
MESSAGES = [{"role": "user", "content": "Grade: {{sample.output_text}} (want {{item.answer}})"}]
RENDERED = [{"role": "user", "content": f"Grade: {SAMPLE} (want 4)"}]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def judged(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[tuple[RunningService, str]]:
    """An API whose inference backend (and so judge endpoint) is a serve on the same data."""
    work = tmp_path_factory.mktemp("judges")
    serve_url = f"http://127.0.0.1:{free_port()}"
    env = {
        "GRPO_INFERENCE_URL": serve_url,
        "GRPO_INFERENCE_TOKEN": TOKEN,
        "GRPO_SECRETS_KEY": Fernet.generate_key().decode(),
    }
    with run_api(env, work, tiny_model_dir) as svc:
        port = int(serve_url.rsplit(":", 1)[1])
        with (work / "serve.log").open("wb") as log:
            proc = subprocess.Popen(
                serve_command("127.0.0.1", port), env=svc.env, stdout=log, stderr=log
            )
        try:
            _wait_serve(serve_url, proc, work)
            yield svc, serve_url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_serve(url: str, proc: subprocess.Popen[bytes], work: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((work / "serve.log").read_text())
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"serve not up\n{(work / 'serve.log').read_text()}")


def serve_requests(serve_url: str) -> int:
    r = httpx.get(f"{serve_url}/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200, r.text
    return int(r.json()["engine"]["requests"])


def answer_of(serve_url: str, messages: list[dict[str, str]]) -> str:
    """What the judge model answers these messages, asked directly (greedy, as judges ask)."""
    body = {"model": TINY, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{serve_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def sdk(svc: RunningService, tenant: str | None = None) -> openai.OpenAI:
    key = svc.new_key(tenant or f"judge-{secrets.token_hex(4)}")
    return openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key=key, max_retries=0)


def score_model(**extra: Any) -> dict[str, Any]:
    return {
        "type": "score_model", "name": "quality", "model": TINY, "input": MESSAGES,
        "range": [0, 10], "sampling_params": {"max_completions_tokens": MAX_TOKENS}, **extra,
    }  # fmt: skip


def run(client: openai.OpenAI, grader: dict[str, Any]) -> Any:
    return client.fine_tuning.alpha.graders.run(
        grader=grader,  # type: ignore[arg-type]
        model_sample=SAMPLE,
        item={"answer": "4"},
    )


def test_a_score_model_grader_scores_what_the_model_answers(
    judged: tuple[RunningService, str],
) -> None:
    svc, serve_url = judged
    answer = answer_of(serve_url, RENDERED)
    before = serve_requests(serve_url)
    result = run(sdk(svc), score_model())
    assert serve_requests(serve_url) == before + 1
    assert result.metadata.type == "score_model" and result.metadata.sampled_model_name == TINY
    try:
        expected = parse_score(answer, 0, 10)
    except JudgeAnswerError:  # the tiny model answered no number: 0, a parse error
        assert result.reward == 0.0 and result.metadata.errors.model_grader_parse_error
    else:
        assert result.reward == expected and not result.metadata.errors.model_grader_parse_error


def test_a_label_model_grader_reads_the_label_in_the_answer(
    judged: tuple[RunningService, str],
) -> None:
    svc, serve_url = judged
    answer = answer_of(serve_url, RENDERED)
    assert answer.strip(), "the tiny model answered nothing to use as a label"
    label = answer.strip()[0]  # a label the answer names (a whole word, or a sign such as ')')
    grader = {
        "type": "label_model", "name": "verdict", "model": TINY, "input": MESSAGES,
        "labels": [label, "never-said-label"], "passing_labels": [label],
    }  # fmt: skip
    client = sdk(svc)
    passing = run(client, grader)
    assert passing.reward == 1.0 and not passing.metadata.errors.model_grader_parse_error
    failing = run(client, {**grader, "passing_labels": ["never-said-label"]})
    assert failing.reward == 0.0 and not failing.metadata.errors.model_grader_parse_error
    garbage = run(client, {**grader, "labels": ["zqxjzqxj"], "passing_labels": ["zqxjzqxj"]})
    assert garbage.reward == 0.0 and garbage.metadata.errors.model_grader_parse_error


def test_a_judge_verifier_test_scores_garbage_0_and_sends_each_input_once(
    judged: tuple[RunningService, str],
) -> None:
    svc, serve_url = judged
    client = svc.client(svc.new_key(f"judge-{secrets.token_hex(4)}"))
    config = {
        "model": TINY, "prompt_template": "Is {{sample.output_text}} right?", "parse": "label",
        "labels": ["zqxjzqxj"], "passing_labels": ["zqxjzqxj"], "max_tokens": MAX_TOKENS,
    }  # fmt: skip
    r = client.post("/v1/verifiers", json={"name": "judge", "kind": "judge", "config": config})
    assert r.status_code == 201, r.text
    samples = [{"prompt": "p", "completion": c} for c in ("a", "b", "a", "{{x}}")]
    before = serve_requests(serve_url)
    r = client.post("/v1/verifiers/judge/test", json={"samples": samples})
    assert r.status_code == 200, r.text
    body = r.json()
    assert serve_requests(serve_url) == before + 3  # "a" twice: sent once
    assert body["scores"] == [None] * 4  # the engine scores these 0 and counts the errors
    assert all("names none of the labels" in e for e in body["errors"]), body


def test_a_job_wide_cache_sends_an_input_once(judged: tuple[RunningService, str]) -> None:
    _, serve_url = judged
    endpoint = JudgeEndpoint(f"{serve_url}/v1/chat/completions", TOKEN, timeout_s=120)
    context = JudgeContext(lambda secret: endpoint)
    config = {"model": TINY, "prompt_template": "Rate {{sample.output_text}} 0-9",
              "range": [0, 9], "max_tokens": MAX_TOKENS}  # fmt: skip
    samples = [{"prompt": "p", "completion": "x"}, {"prompt": "p", "completion": "y"}]
    before = serve_requests(serve_url)
    with open_verifier("judge", config, name="rate", judges=context) as judge:
        first = judge.score(samples)
        second = judge.score(samples[::-1])
    assert serve_requests(serve_url) == before + 2
    assert second == (first[0][::-1], first[1][::-1])
    metrics = context.take_metrics()
    assert metrics["judge/rate/calls"] == 2 and metrics["judge/rate/cache_hits"] == 2
    assert metrics["judge/rate/seconds"] > 0
    assert metrics["judge/rate/errors"] == 2 * sum(e is not None for e in first[1])
    assert context.take_metrics() == {}  # taken per step


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"base_url": "http://10.0.0.1:8000/v1"}, "$.config.base_url"),
        ({"api_key": "sk-x"}, "$.config.api_key"),
        ({"model": "http://169.254.169.254/latest"}, "$.config.model"),
        ({"endpoint_secret": "nobody-has-it"}, "$.config.endpoint_secret"),
        ({"model": "no-such-model"}, "$.config.model"),
    ],
)
def test_a_judge_names_no_url_and_only_its_tenants_models(
    judged: tuple[RunningService, str], config: dict[str, Any], path: str
) -> None:
    svc, _ = judged
    client = svc.client(svc.new_key(f"judge-{secrets.token_hex(4)}"))
    body = {"model": TINY, "prompt_template": "{{sample.output_text}}", **config}
    r = client.post("/v1/verifiers", json={"name": "j", "kind": "judge", "config": body})
    assert r.status_code == 422, r.text
    assert path in [e["path"] for e in r.json()["errors"]], r.json()


def test_a_graders_url_is_refused_and_a_strangers_checkpoint_is_missing(
    judged: tuple[RunningService, str],
) -> None:
    svc, _ = judged
    client = sdk(svc)
    bad_input = [{"role": "user", "content": "x", "url": "http://127.0.0.1:6379"}]
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.fine_tuning.alpha.graders.validate(grader=score_model(input=bad_input))  # type: ignore[arg-type]
    assert info.value.param == "grader.input.0.url"  # OpenAI's error object

    owner = svc.client(svc.new_key(f"judge-owner-{secrets.token_hex(4)}"))
    make_verifier(owner)
    ckpt = seed_checkpoint(svc, make_job(owner, make_dataset(owner))["id"])
    missing = "ckpt_0000000000000000000000"
    errors = {}
    for model in (ckpt, missing):
        multi = {"type": "multi", "name": "m", "calculate_output": "q",
                 "graders": {"q": score_model(model=model)}}  # fmt: skip
        with pytest.raises(openai.UnprocessableEntityError) as info:
            client.fine_tuning.alpha.graders.validate(grader=multi)  # type: ignore[arg-type]
        error = info.value.body
        assert isinstance(error, dict)
        errors[model] = {**error, "message": error["message"].replace(model, "X")}
    assert errors[ckpt] == errors[missing]
    assert errors[ckpt]["param"] == "grader.graders.q.model"
    own = owner.post("/v1/fine_tuning/alpha/graders/validate", json={
        "grader": score_model(model=ckpt)})  # fmt: skip
    assert own.status_code == 200, own.text


def test_a_tenant_secrets_private_endpoint_is_refused(judged: tuple[RunningService, str]) -> None:
    svc, _ = judged
    client = svc.client(svc.new_key(f"judge-{secrets.token_hex(4)}"))
    value = '{"base_url": "https://127.0.0.1:1/v1", "api_key": "k"}'
    r = client.post("/v1/secrets", json={"name": "judge-endpoint", "value": value})
    assert r.status_code in (200, 201), r.text
    config = {"model": "gpt-4o-mini", "prompt_template": "{{sample.output_text}}",
              "endpoint_secret": "judge-endpoint"}  # fmt: skip
    r = client.post("/v1/verifiers", json={"name": "ext", "kind": "judge", "config": config})
    assert r.status_code == 201, r.text
    r = client.post(
        "/v1/verifiers/ext/test", json={"samples": [{"prompt": "p", "completion": "c"}]}
    )
    assert r.status_code == 200, r.text
    (error,) = r.json()["errors"]
    assert "not a public address" in error and r.json()["scores"] == [None]
