"""`/v1/fine_tuning/alpha/graders/{validate,run}` through the official `openai` SDK against a
real API process (issue 18 item 3), and OpenAI graders registered as our own verifiers."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.api.conftest import served_over_http, tenant_client
from tests.e2e.services import RunningService

api = served_over_http()  # the official SDK speaks HTTP


STRING_CHECK = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
                "reference": "{{item.answer}}", "operation": "eq"}  # fmt: skip
FUZZY = {"type": "text_similarity", "name": "fuzzy", "input": "{{sample.output_text}}",
         "reference": "{{item.reference}}", "evaluation_metric": "fuzzy_match"}  # fmt: skip
PYTHON_SOURCE = """
def grade(sample, item):
    return 1.0 if (sample["output_json"] or {}).get("n") == item["n"] else 0.0
"""
PYTHON = {"type": "python", "name": "py", "source": PYTHON_SOURCE}


@pytest.fixture(scope="module")
def sdk(api: RunningService) -> Iterator[OpenAI]:
    key = api.new_key(f"graders-{secrets.token_hex(4)}")
    with OpenAI(base_url=f"{api.base_url}/v1", api_key=key, max_retries=0) as client:
        yield client


def run(sdk: OpenAI, grader: dict[str, Any], model_sample: str, item: dict[str, Any]) -> Any:
    return sdk.fine_tuning.alpha.graders.run(
        grader=grader,  # type: ignore[arg-type]
        model_sample=model_sample,
        item=item,
    )


def test_validate_returns_the_grader(sdk: OpenAI) -> None:
    answer = sdk.fine_tuning.alpha.graders.validate(grader=STRING_CHECK)  # type: ignore[arg-type]
    assert answer.grader is not None and answer.grader.to_dict() == STRING_CHECK


@pytest.mark.parametrize(
    ("grader", "path", "message"),
    [
        ({**STRING_CHECK, "operation": "gt"}, "$.grader.operation", "'eq', 'ne', 'like'"),
        ({**STRING_CHECK, "input": "{{item.__class__}}"}, "$.grader.input", "'__'"),
        ({**STRING_CHECK, "reference": "{{answer}}"}, "$.grader.reference", "starts with"),
        ({**FUZZY, "evaluation_metric": "meteor"}, "$.grader.evaluation_metric", "WordNet"),
        ({"type": "multi", "name": "m", "graders": {"a": STRING_CHECK},
          "calculate_output": "a + open('x')"}, "$.grader.calculate_output", "functions"),
    ],
)  # fmt: skip
def test_a_bad_grader_is_a_422_naming_the_field(
    sdk: OpenAI, grader: dict[str, Any], path: str, message: str
) -> None:
    for call in (
        lambda: sdk.fine_tuning.alpha.graders.validate(grader=grader),  # type: ignore[arg-type]
        lambda: run(sdk, grader, "x", {}),
    ):
        with pytest.raises(openai.UnprocessableEntityError) as info:
            call()
        # OpenAI's error object, as its SDK reads it: `param` the field, `code`, `message`
        error = info.value
        assert error.param == path.removeprefix("$.") and error.type == "invalid_request_error"
        assert error.code == "validation_error" and message in error.message, error.body


def test_a_judges_unknown_model_is_a_422_and_a_bad_key_a_401(
    api: RunningService, sdk: OpenAI
) -> None:
    judge = {"type": "score_model", "name": "judge", "model": "no-such-model",
             "input": [{"role": "user", "content": "{{sample.output_text}}"}]}  # fmt: skip
    with pytest.raises(openai.UnprocessableEntityError) as info:
        sdk.fine_tuning.alpha.graders.validate(grader=judge)  # type: ignore[arg-type]
    assert info.value.param == "grader.model"
    stranger = OpenAI(base_url=f"{api.base_url}/v1", api_key="not-a-key", max_retries=0)
    with stranger, pytest.raises(openai.AuthenticationError):
        stranger.fine_tuning.alpha.graders.validate(grader=STRING_CHECK)  # type: ignore[arg-type]


def test_run_answers_openais_response_shape(sdk: OpenAI) -> None:
    result = run(sdk, STRING_CHECK, "4", {"answer": "4"})
    assert result.reward == 1.0 and result.sub_rewards == {}
    assert result.metadata.name == "exact" and result.metadata.type == "string_check"
    assert result.metadata.execution_time > 0 and result.metadata.scores == {}
    assert not any(v for v in result.metadata.errors.to_dict().values())
    assert result.api_model_grader_token_usage_per_model == {}
    assert run(sdk, STRING_CHECK, "5", {"answer": "4"}).reward == 0.0


def test_run_scores_text_similarity_and_python_graders(sdk: OpenAI) -> None:
    fuzzy = run(sdk, FUZZY, "kitten", {"reference": "sitting"})
    assert fuzzy.reward == pytest.approx(8 / 13)  # rapidfuzz: Indel distance 5 over 13 chars
    assert run(sdk, PYTHON, '{"n": 3}', {"n": 3}).reward == 1.0
    assert run(sdk, PYTHON, "three", {"n": 3}).reward == 0.0


def test_run_reports_errors_in_openais_flags(sdk: OpenAI) -> None:
    missing = run(sdk, STRING_CHECK, "4", {})
    assert missing.reward == 0.0 and missing.metadata.errors.invalid_variable_error
    crashing = run(sdk, PYTHON, '{"n": 3}', {})
    errors = crashing.metadata.errors
    assert crashing.reward == 0.0 and errors.python_grader_runtime_error
    assert "KeyError" in str(errors.python_grader_runtime_error_details)


def test_run_a_multi_grader_gives_sub_rewards(sdk: OpenAI) -> None:
    multi = {"type": "multi", "name": "m", "calculate_output": "0.25 * exact + 0.75 * py",
             "graders": {"exact": STRING_CHECK, "py": PYTHON}}  # fmt: skip
    result = run(sdk, multi, '{"n": 3}', {"answer": "4", "n": 3})
    assert result.reward == 0.75 and result.sub_rewards == {"exact": 0.0, "py": 1.0}
    assert result.metadata.scores == {"exact": 0.0, "py": 1.0}
    broken = {**multi, "calculate_output": "log(exact)"}
    failed = run(sdk, broken, '{"n": 3}', {"answer": "4", "n": 3})
    assert failed.reward == 0.0 and failed.metadata.errors.formula_parse_error


def test_a_slow_python_grader_does_not_block_the_api(api: RunningService, sdk: OpenAI) -> None:
    source = "import time\ndef grade(sample, item):\n    time.sleep(2)\n    return 1\n"
    slow = {"type": "python", "name": "slow", "source": source}
    answers: list[float] = []
    worker = threading.Thread(target=lambda: answers.append(run(sdk, slow, "x", {}).reward))
    started = time.monotonic()
    worker.start()
    time.sleep(0.3)
    health = []
    while worker.is_alive():
        probe = time.monotonic()
        assert httpx.get(f"{api.base_url}/healthz", timeout=5).status_code == 200
        health.append(time.monotonic() - probe)
        time.sleep(0.1)
    worker.join()
    assert answers == [1.0] and time.monotonic() - started >= 2
    assert health and max(health) < 1.0, health


def test_graders_register_as_verifiers_of_kind_openai_grader(api: RunningService) -> None:
    with tenant_client(api) as client:
        bad = {"name": "g", "kind": "openai_grader", "config": {**STRING_CHECK, "operation": "x"}}
        r = client.post("/v1/verifiers", json=bad)
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
        assert [e["path"] for e in r.json()["errors"]] == ["$.config.operation"]
        grader = {"name": "g", "kind": "openai_grader", "config": STRING_CHECK}
        r = client.post("/v1/verifiers", json=grader)
        assert r.status_code == 201, r.text
        samples = [{"prompt": "2+2", "completion": "4", "answer": "4"},
                   {"prompt": "2+2", "completion": "5", "answer": "4"}]  # fmt: skip
        r = client.post("/v1/verifiers/g/test", json={"samples": samples})
        assert r.status_code == 200 and r.json()["scores"] == [1.0, 0.0], r.text
        with tenant_client(api) as other:  # another tenant's grader answers like a missing one
            r = other.post("/v1/verifiers/g/test", json={"samples": samples})
            assert r.status_code == 404 and r.json()["detail"] == "verifier 'g' not found"


def test_a_run_over_the_python_sandbox_cap_is_refused(sdk: OpenAI) -> None:
    # GRPO_MAX_PYTHON_SANDBOXES_PER_JOB is 8: nine python graders would open nine sandboxes.
    graders = {f"p{i}": {**PYTHON, "name": f"p{i}"} for i in range(9)}
    multi = {"type": "multi", "name": "many", "graders": graders, "calculate_output": "p0"}
    with pytest.raises(openai.UnprocessableEntityError) as info:
        run(sdk, multi, '{"n": 1}', {"n": 1})
    error = info.value
    assert error.param == "grader.graders" and "9 python sandboxes" in error.message
