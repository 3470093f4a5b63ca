"""A judge model's answer read as a score or a label, and judge configs refused at creation
(issue 18 items 3-4): pure functions, no model."""

from __future__ import annotations

import pytest

from workers.verifiers import (
    JudgeUnavailableError,
    VerifierConfigError,
    open_verifier,
    validate_config,
)
from workers.verifiers.judge_answers import JudgeAnswerError, parse_label, parse_score


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("7", 7.0), ("Score: 8/10", 8.0), ("-0.5 at most", 0.0), ("1e3", 10.0),
        ("I'd say .25", 0.25), ("  3.  ", 3.0), ("between 2 and 9", 2.0),
    ],
)  # fmt: skip
def test_a_score_is_the_first_number_clamped(answer: str, score: float) -> None:
    assert parse_score(answer, 0.0, 10.0) == score


@pytest.mark.parametrize("answer", ["", "no idea", "))))", "inf", "nan", "1e999"])
def test_an_answer_without_a_finite_number_is_an_error(answer: str) -> None:
    with pytest.raises(JudgeAnswerError):
        parse_score(answer, 0.0, 1.0)


def test_a_label_is_the_answer_or_the_first_one_named() -> None:
    labels = ["correct", "incorrect", "partially correct"]
    assert parse_label("Incorrect.", labels) == "incorrect"
    assert parse_label("**partially correct**", labels) == "partially correct"
    assert parse_label("It is incorrect, not correct", labels) == "incorrect"
    assert parse_label("correctness: correct", labels) == "correct"  # whole words only
    with pytest.raises(JudgeAnswerError, match="names none of the labels"):
        parse_label("maybe", labels)


def judge(**extra: object) -> dict[str, object]:
    return {"model": "tiny", "prompt_template": "Rate {{sample.output_text}}", **extra}


@pytest.mark.parametrize(
    ("config", "path", "message"),
    [
        (judge(url="http://10.0.0.1"), ("url",), "never in its config"),
        (judge(model="https://api.example.com/v1"), ("model",), "not a URL"),
        (judge(model="//metadata/x"), ("model",), "not a URL"),
        (judge(prompt_template="{{os.environ}}"), ("prompt_template",), "starts with 'os'"),
        (judge(parse="label"), (), "needs labels and passing_labels"),
        (judge(parse="label", labels=["a"], passing_labels=["b"]), (), "not among the labels"),
        (judge(labels=["a"]), (), "go with parse 'label'"),
        (judge(range=[1, 0]), ("range",), "lo < hi"),
        (judge(endpoint_secret="../x"), ("endpoint_secret",), "should match pattern"),
    ],
)
def test_a_bad_judge_config_names_the_field(
    config: dict[str, object], path: tuple[object, ...], message: str
) -> None:
    with pytest.raises(VerifierConfigError) as info:
        validate_config("judge", config)
    assert any(p == path and message in m for p, m in info.value.errors), info.value.errors


def test_a_judge_without_an_endpoint_does_not_open() -> None:
    with pytest.raises(JudgeUnavailableError, match="needs a judge endpoint"):
        open_verifier("judge", judge(), name="j")
