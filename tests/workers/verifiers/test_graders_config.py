"""OpenAI graders as the `openai_grader` verifier kind: templates, the calculate_output
evaluator, and everything refused at creation (issue 18 item 3). No process is started here."""

from __future__ import annotations

from typing import Any

import pytest

from workers.verifiers import VerifierConfigError, validate_config
from workers.verifiers.grader_expression import ExpressionError, evaluate, parse_expression
from workers.verifiers.grader_templates import (
    MissingField,
    TemplateError,
    parse_template,
    render,
    sample_namespace,
)


def string_check(input: str = "{{sample.output_text}}", **over: Any) -> dict[str, Any]:
    return {"type": "string_check", "name": "sc", "input": input,
            "reference": "{{item.answer}}", "operation": "eq", **over}  # fmt: skip


def refusal(grader: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(VerifierConfigError) as info:
        validate_config("openai_grader", grader)
    return info.value.errors


# ----------------------------------------------------------------------------- templates


def test_templates_read_item_fields_nested_fields_list_items_and_the_sample() -> None:
    item = {"answer": "4", "meta": {"unit": "cm", "tags": ["a", "b"]}, "n": 4, "ok": True}
    sample = sample_namespace('{"value": 4, "words": ["x"]}')
    template = parse_template(
        "{{item.answer}}|{{ item.meta.unit }}|{{item.meta.tags.1}}|{{item.n}}|{{item.ok}}|"
        "{{sample.output_json.value}}|{{sample.output_json.words}}|{{sample.output_text}}"
    )
    rendered = render(template, item, sample)
    assert rendered == '4|cm|b|4|true|4|["x"]|{"value": 4, "words": ["x"]}'


def test_a_missing_field_or_a_non_json_sample_is_an_error_for_that_item() -> None:
    with pytest.raises(MissingField, match=r"item.meta.unit is not in the item"):
        render(parse_template("{{item.meta.unit}}"), {"meta": {}}, sample_namespace("x"))
    with pytest.raises(MissingField, match="not JSON"):
        render(parse_template("{{sample.output_json.x}}"), {}, sample_namespace("not json"))


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{foo.x}}", "starts with 'foo'"),
        ("{{sample.logprobs}}", "a sample has only output_text and output_json"),
        ("{{sample.output_text.x}}", "is a string"),
        ("{{item}}", "names no field"),
        ("{{item.answer", "without its closing"),
        ("answer}}", "without its opening"),
        ("{{item.x | attr('y')}}", "not a field reference"),
        ("{{ item['x'] }}", "not a field reference"),
        ("{{item.__class__}}", "names starting with '__'"),
        ("{{item.x.__globals__}}", "names starting with '__'"),
    ],
)
def test_a_bad_template_is_refused_at_creation_naming_the_field(
    template: str, message: str
) -> None:
    with pytest.raises(TemplateError, match=message.replace("|", r"\|")):
        parse_template(template)
    [(path, text)] = refusal(string_check(input=template))
    assert path == ("input",) and message in text


def test_a_template_without_holes_is_literal_text() -> None:
    literal = "yes {not a hole}"
    assert render(parse_template(literal), {}, sample_namespace("")) == literal


# ----------------------------------------------------------------------------- calculate_output


def test_the_expression_evaluates_arithmetic_and_the_whitelisted_functions() -> None:
    names = ["a", "b"]
    values = {"a": 0.25, "b": 4.0}
    cases = {
        "0.5 * a + 0.5 * b": 2.125,
        "-a + b ** 2 / 8": 1.75,
        "(a + b) * 2": 8.5,
        "min(a, b) + max(a, b, 10)": 10.25,
        "abs(-b) + floor(2.7) + ceil(a)": 7.0,
        "sqrt(b) + log(exp(a))": 2.25,
    }
    for text, expected in cases.items():
        assert evaluate(parse_expression(text, names), values) == pytest.approx(expected), text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a + z", "'z' is not one of the graders"),
        ("__import__('os').system('id')", "only these functions can be called"),
        ("a.__class__", "Attribute is not allowed"),
        ("a[0]", "Subscript is not allowed"),
        ("a if b else 1", "IfExp is not allowed"),
        ("a > b", "Compare is not allowed"),
        ("(lambda: 1)()", "only these functions can be called"),
        ("a // b", "FloorDiv is not allowed"),
        ("'x'", "is not a number"),
        ("min(a)", "min() takes 2 to 64 arguments"),
        ("abs(x=a)", "plain arguments only"),
        ("a +", "does not parse"),
    ],
)
def test_anything_outside_the_arithmetic_is_refused(text: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_expression(text, ["a", "b"])


def test_domain_errors_and_runaway_powers_fail_the_item_not_the_process() -> None:
    for text in ("log(a - a)", "a / (b - b)", "(-b) ** 0.5", "10 ** 10 ** 10", "exp(1000)"):
        with pytest.raises((ArithmeticError, ValueError)):
            evaluate(parse_expression(text, ["a", "b"]), {"a": 1.0, "b": 8.0})


# ----------------------------------------------------------------------------- creation


def test_a_valid_grader_is_stored_normalised() -> None:
    multi = {"type": "multi", "name": "m", "calculate_output": "a",
             "graders": {"a": string_check()}}  # fmt: skip
    stored = validate_config("openai_grader", multi)
    assert stored["graders"]["a"] == {**string_check()}
    python = {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1\n"}
    assert validate_config("openai_grader", python)["image_tag"] is None


@pytest.mark.parametrize(
    ("grader", "path", "message"),
    [
        (string_check(operation="gt"), ("operation",), "Input should be 'eq', 'ne', 'like'"),
        ({**string_check(), "type": "text_similarity", "evaluation_metric": "jaccard"},
         ("evaluation_metric",), "Input should be"),
        ({**string_check(), "type": "text_similarity", "evaluation_metric": "meteor"},
         ("evaluation_metric",), "WordNet"),
        ({**string_check(), "type": "text_similarity", "evaluation_metric": "cosine"},
         ("evaluation_metric",), "embedding model"),
        ({"type": "score_model", "name": "judge", "model": "tiny", "input": []}, ("input",),
         "at least 1 item"),
        ({"type": "score_model", "name": "j", "model": "http://10.0.0.1/v1",
          "input": [{"role": "user", "content": "x"}]}, ("model",), "not a URL"),
        ({"type": "label_model", "name": "j", "model": "m", "labels": ["a"],
          "passing_labels": ["a"], "input": [{"role": "user", "content": "x",
                                              "base_url": "http://x"}]},
         ("input", 0, "base_url"), "never in its config"),
        ({"type": "regex", "name": "x"}, ("type",), "unknown grader type 'regex'"),
        ({"type": "python", "name": "p", "source": "def verify(prompt, completion):\n  return 1"},
         ("source",), "grade(sample, item)"),
        ({"type": "python", "name": "p", "source": "def grade(:"}, ("source",), "SyntaxError"),
        ({**string_check(), "extra": 1}, ("extra",), "Extra inputs are not permitted"),
        ({"type": "multi", "name": "m", "calculate_output": "a + b",
          "graders": {"a": string_check()}}, ("calculate_output",), "'b' is not one of"),
        ({"type": "multi", "name": "m", "calculate_output": "a",
          "graders": {"a": string_check(input="{{x.y}}")}}, ("graders", "a", "input"), "'x'"),
        ({"type": "multi", "name": "m", "calculate_output": "a",
          "graders": {"a": {"type": "multi", "name": "in", "calculate_output": "1",
                            "graders": {}}}}, ("graders", "a", "type"), "cannot be multi"),
        ({"type": "multi", "name": "m", "calculate_output": "1",
          "graders": {"min": string_check()}}, ("graders", "min"), "not a function"),
    ],
)  # fmt: skip
def test_a_bad_grader_is_refused_at_creation_with_the_field_path(
    grader: dict[str, Any], path: tuple[str, ...], message: str
) -> None:
    errors = refusal(grader)
    assert any(p == path and message in m for p, m in errors), errors
