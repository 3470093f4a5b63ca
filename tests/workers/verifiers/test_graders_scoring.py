"""OpenAI graders scoring (issue 18 item 3): every operation and metric against hand-worked
values and the libraries' own calls, in the built-in helper process under its deadline, the
python grader in the real sandbox, and multi graders over both."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sacrebleu
from rapidfuzz import fuzz

from workers.verifiers import BuiltinHost, open_verifier
from workers.verifiers.builtin_host import HostedVerifier
from workers.verifiers.factory import in_process_verifier
from workers.verifiers.grader_kind import MultiGraderVerifier

KIND = "openai_grader"


def sample(completion: str, **item: Any) -> dict[str, Any]:
    return {"prompt": "p", "completion": completion, **item}


def similarity(metric: str) -> dict[str, Any]:
    return {"type": "text_similarity", "name": metric, "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}", "evaluation_metric": metric}  # fmt: skip


def in_process(grader: dict[str, Any], samples: list[dict[str, Any]]) -> list[float | None]:
    scores, errors = in_process_verifier(KIND, grader, "g").score(samples)
    assert errors == [None] * len(samples), errors
    return scores


@pytest.fixture(scope="module")
def host() -> Iterator[BuiltinHost]:
    shared = BuiltinHost()
    yield shared
    shared.close()


@pytest.mark.parametrize(
    ("operation", "expected"),
    [("eq", [1.0, 0.0, 0.0, 0.0]), ("ne", [0.0, 1.0, 1.0, 1.0]),
     ("like", [1.0, 1.0, 0.0, 0.0]), ("ilike", [1.0, 1.0, 1.0, 0.0])],
)  # fmt: skip
def test_string_check_operations(operation: str, expected: list[float]) -> None:
    grader = {"type": "string_check", "name": "sc", "input": "{{sample.output_text}}",
              "reference": "{{item.answer}}", "operation": operation}  # fmt: skip
    # equal; contains it; contains it in another case; does not contain it
    batch = [sample("Paris", answer="Paris"), sample("It is Paris.", answer="Paris"),
             sample("it is PARIS", answer="Paris"), sample("Lyon", answer="Paris")]  # fmt: skip
    assert in_process(grader, batch) == expected


def test_fuzzy_match_is_rapidfuzz_ratio_over_100() -> None:
    # Indel distance kitten -> sitting is 5 over 13 characters: (13 - 5) / 13.
    [score] = in_process(similarity("fuzzy_match"), [sample("kitten", reference="sitting")])
    assert score == pytest.approx(8 / 13)
    assert score == pytest.approx(fuzz.ratio("kitten", "sitting") / 100)


def test_bleu_is_sacrebleu_sentence_bleu_over_100() -> None:
    text, ref = "the cat sat on the mat today", "the cat is on the mat today"
    scores = in_process(
        similarity("bleu"),
        [sample(text, reference=ref), sample(ref, reference=ref), sample("xyz", reference=ref)],
    )
    assert scores[0] == pytest.approx(sacrebleu.sentence_bleu(text, [ref]).score / 100)
    assert 0 < scores[0] < 1 and scores[1] == pytest.approx(1.0) and scores[2] == 0.0


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # "the cat sat" against "the cat ran": 1- to 4-grams, 6 each side, 3 shared (the, cat,
        # the cat): GLEU = min(precision, recall) = 3/6.
        ("gleu", 0.5),
        # unigram F1: 2 of 3 each side; bigrams: 1 of 2; trigrams: none; LCS 2 of 3.
        ("rouge_1", 2 / 3), ("rouge_2", 0.5), ("rouge_3", 0.0), ("rouge_4", 0.0),
        ("rouge_5", 0.0), ("rouge_l", 2 / 3),
    ],
)  # fmt: skip
def test_gleu_and_rouge_against_hand_worked_values(metric: str, expected: float) -> None:
    [score] = in_process(similarity(metric), [sample("the cat sat", reference="the cat ran")])
    assert score == pytest.approx(expected)


def test_identical_long_texts_score_one_on_every_metric() -> None:
    text = "one two three four five six"
    for metric in ("fuzzy_match", "bleu", "gleu", "rouge_4", "rouge_5", "rouge_l"):
        assert in_process(similarity(metric), [sample(text, reference=text)]) == [
            pytest.approx(1.0)
        ], metric


def test_templates_read_output_json_and_nested_item_fields(host: BuiltinHost) -> None:
    grader = {"type": "string_check", "name": "json", "operation": "eq",
              "input": "{{sample.output_json.city}}",
              "reference": "{{item.expected.city}}"}  # fmt: skip
    batch = [sample('{"city": "Oslo"}', expected={"city": "Oslo"}),
             sample('{"city": "Rome"}', expected={"city": "Oslo"}),
             sample("Oslo", expected={"city": "Oslo"}),
             sample('{"city": "Oslo"}', expected={})]  # fmt: skip
    with open_verifier(KIND, grader, name="json", host=host) as verifier:
        assert isinstance(verifier, HostedVerifier)  # scored in the helper process
        scores, errors = verifier.score(batch)
    assert scores == [1.0, 0.0, None, None]
    assert errors[:2] == [None, None]
    assert "not JSON" in str(errors[2])
    assert "item.expected.city is not in the item" in str(errors[3])


def test_text_similarity_is_cut_off_at_the_helpers_deadline() -> None:
    # rapidfuzz's ratio over two 400,000-character strings runs for seconds in C.
    slow = BuiltinHost(timeout_s=0.5)
    big = "ab" * 200_000
    with open_verifier(KIND, similarity("fuzzy_match"), name="slow", host=slow) as verifier:
        started = time.monotonic()
        scores, errors = verifier.score([sample(big, reference="ba" * 200_000)])
        elapsed = time.monotonic() - started
        assert scores == [None] and "timeout" in str(errors[0])
        assert elapsed < 5
        assert verifier.score([sample("abc", reference="abc")]) == ([1.0], [None])
    slow.close()
    assert slow.spawns == 2  # the stuck helper was killed and a fresh one served the next batch


PYTHON_SOURCE = """
def grade(sample, item):
    value = (sample["output_json"] or {}).get("answer")
    return 1.0 if value == item["answer"] else 0.25 * len(sample["output_text"]) / 100
"""


def test_a_python_grader_runs_grade_in_the_sandbox(host: BuiltinHost) -> None:
    grader = {"type": "python", "name": "py", "source": PYTHON_SOURCE}
    batch = [sample('{"answer": 7}', answer=7), sample("x" * 40, answer=7), sample("y")]
    with open_verifier(KIND, grader, name="py", host=host) as verifier:
        assert type(verifier).__name__ == "PythonVerifier"
        scores, errors = verifier.score(batch)
        assert verifier.stats.spawns == 1  # type: ignore[attr-defined]
    assert scores[:2] == [1.0, pytest.approx(0.1)]
    assert scores[2] is None and "KeyError" in str(errors[2])


def test_multi_combines_sub_graders_by_calculate_output(host: BuiltinHost) -> None:
    grader = {
        "type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * fuzzy + 0 * py",
        "graders": {
            "exact": {"type": "string_check", "name": "e", "input": "{{sample.output_text}}",
                      "reference": "{{item.reference}}", "operation": "eq"},
            "fuzzy": similarity("fuzzy_match"),
            "py": {"type": "python", "name": "py", "source": PYTHON_SOURCE},
        },
    }  # fmt: skip
    batch = [sample("kitten", reference="kitten", answer=1),
             sample("kitten", reference="sitting", answer=1),
             sample("kitten", reference="sitting")]  # fmt: skip
    with open_verifier(KIND, grader, name="m", host=host) as verifier:
        assert isinstance(verifier, MultiGraderVerifier)
        (scores, errors), parts = verifier.score_parts(batch)
    assert scores[:2] == [pytest.approx(1.0), pytest.approx(0.5 * 8 / 13)]
    assert parts[1]["exact"] == 0.0 and parts[1]["fuzzy"] == pytest.approx(8 / 13)
    assert scores[2] is None and str(errors[2]).startswith("grader py: KeyError")


def test_a_formula_error_fails_the_item_naming_calculate_output(host: BuiltinHost) -> None:
    grader = {"type": "multi", "name": "m", "calculate_output": "log(a)",
              "graders": {"a": similarity("bleu")}}  # fmt: skip
    with open_verifier(KIND, grader, name="m", host=host) as verifier:
        scores, errors = verifier.score([sample("x", reference="y z w v")])
    assert scores == [None] and str(errors[0]).startswith("calculate_output: ValueError")
