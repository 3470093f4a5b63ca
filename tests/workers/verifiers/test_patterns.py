"""Tenant regexes run on RE2: a catastrophic pattern costs linear time, a pattern RE2 cannot run
is refused at registration with the reason, and schemas keep their meaning."""

from __future__ import annotations

import json
import time

import pytest
from jsonschema import validators

from workers.verifiers import VerifierConfigError, open_verifier, validate_config

EVIL = r"^(a+)+$"
EVIL_TEXT = "a" * 34 + "b"  # Python's re backtracks 2**34 ways here


def score(kind: str, config: dict, completions: list[str]) -> list[float | None]:
    with open_verifier(kind, validate_config(kind, config)) as v:
        return v.score([{"prompt": "p", "completion": c} for c in completions])[0]


def test_a_catastrophic_regex_runs_in_linear_time() -> None:
    start = time.monotonic()
    assert score("regex", {"pattern": EVIL}, [EVIL_TEXT, "aaaa", EVIL_TEXT * 1000]) == [0, 1, 0]
    assert time.monotonic() - start < 2.0


def test_flags_and_groups_work_as_with_re() -> None:
    cfg = {"pattern": r"answer: (?P<n>\d+)", "field": "n", "group": "n", "flags": ["IGNORECASE"]}
    with open_verifier("regex", validate_config("regex", {**cfg, "field": "answer"})) as v:
        scores, _ = v.score([{"completion": "ANSWER: 42", "answer": "42"},
                             {"completion": "answer: 41", "answer": "42"}])  # fmt: skip
    assert scores == [1.0, 0.0]
    assert score("regex", {"pattern": "a.b", "flags": ["DOTALL"]}, ["a\nb", "ab"]) == [1.0, 0.0]
    assert score("regex", {"pattern": "^b", "flags": ["MULTILINE"]}, ["a\nb", "ab"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [(r"(a)\1", "invalid escape sequence"), (r"(?<=a)b", "invalid perl operator"),
     (r"a(?!b)", "invalid perl operator")],
)  # fmt: skip
def test_what_re2_cannot_run_is_refused_with_the_reason(pattern: str, reason: str) -> None:
    with pytest.raises(VerifierConfigError) as exc:
        validate_config("regex", {"pattern": pattern})
    (path, message), *_ = exc.value.errors
    assert path == ("pattern",)
    assert "linear-time regex engine (RE2)" in message and reason in message


def test_schema_regexes_are_checked_at_registration() -> None:
    bad = {"type": "object", "properties": {"x": {"type": "string", "pattern": r"(a)\1"}}}
    with pytest.raises(VerifierConfigError) as exc:
        validate_config("json_schema", {"schema": bad})
    assert "at properties/x/pattern: not supported by the linear-time" in str(exc.value)
    with pytest.raises(VerifierConfigError, match="at patternProperties/"):
        validate_config("json_schema", {"schema": {"patternProperties": {"(?=x)": {}}}})
    deep: dict = {}
    for _ in range(40):
        deep = {"items": deep}
    with pytest.raises(VerifierConfigError, match="nests 41 levels deep; the limit is 32"):
        validate_config("json_schema", {"schema": deep})


SCHEMA = {
    "type": "object",
    "properties": {"x": {"type": "string", "pattern": EVIL}},
    "patternProperties": {r"^y\d$": {"type": "integer"}},
    "additionalProperties": {"type": "boolean"},
}
INSTANCES = [
    {"x": "a" * 40 + "b"}, {"x": "aaa"}, {"x": "aa", "y1": 3}, {"x": "aa", "y1": "s"},
    {"x": "aa", "z": True}, {"x": "aa", "z": 1}, {"y22": "s"}, [], "a",
]  # fmt: skip


@pytest.mark.parametrize("additional", [SCHEMA["additionalProperties"], False, True])
def test_schema_keywords_on_re2_agree_with_jsonschema(additional: object) -> None:
    schema = {**SCHEMA, "additionalProperties": additional}
    stock = validators.validator_for(schema)(schema)
    expected = [1.0 if stock.is_valid(i) else 0.0 for i in INSTANCES[1:]]  # stock: not the evil one
    ours = score("json_schema", {"schema": schema, "extract": "whole"},
                 [json.dumps(i) for i in INSTANCES])  # fmt: skip
    assert ours[0] == 0.0 and ours[1:] == expected
