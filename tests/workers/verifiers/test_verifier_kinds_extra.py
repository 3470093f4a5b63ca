"""json_schema and composite kinds; the sandbox-mode switch."""

import pytest

from workers.verifiers import (
    SandboxUnavailableError,
    VerifierConfigError,
    open_verifier,
    pin_composite,
    sandbox,
    sandbox_mode,
)

SCHEMA = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}


def s(completion, **fields):
    return {"prompt": "p", "completion": completion, **fields}


def test_json_schema_whole_and_fenced():
    with open_verifier("json_schema", {"schema": SCHEMA}) as v:
        scores, errors = v.score(
            [s('{"a": 1}'), s('Sure:\n```json\n{"a": 2}\n```'), s('{"a": "x"}'), s("no json")]
        )
    assert scores == [1.0, 1.0, 0.0, 0.0] and errors == [None] * 4


def test_json_schema_field_must_match():
    with open_verifier("json_schema", {"schema": SCHEMA, "field": "ref", "extract": "whole"}) as v:
        scores, errors = v.score(
            [s('{"a": 1}', ref='{"a": 1}'), s('{"a": 1}', ref={"a": 2}), s('{"a": 1}')]
        )
    assert scores == [1.0, 0.0, None] and "ref" in errors[2]


def test_json_schema_config_errors():
    with pytest.raises(VerifierConfigError) as exc:
        open_verifier("json_schema", {"schema": {"type": "nope"}})
    assert exc.value.errors[0][0] == ("schema",)


REGISTRY = {
    ("exact", 1): ("exact_match", {"field": "answer"}),
    ("exact", 2): ("exact_match", {"field": "answer", "case_sensitive": False}),
    ("len", 1): ("length", {"target": 2, "penalty": 0.5}),
    ("inner", 1): ("composite", {"parts": [{"name": "exact", "version": 1, "weight": 1.0}]}),
    ("loop", 1): ("composite", {"parts": [{"name": "loop", "version": 1, "weight": 1.0}]}),
}


def resolve(name, version):
    if version is None:
        versions = [v for (n, v) in REGISTRY if n == name]
        if not versions:
            raise LookupError(name)
        version = max(versions)
    if (name, version) not in REGISTRY:
        raise LookupError(name)
    kind, config = REGISTRY[(name, version)]
    return version, kind, config


def test_pin_composite_fills_latest_versions_and_refuses_unknowns_and_cycles():
    pinned = pin_composite({"parts": [{"name": "exact"}, {"name": "inner", "weight": 2}]}, resolve)
    assert [(p["name"], p["version"], p["weight"]) for p in pinned["parts"]] == [
        ("exact", 2, 1.0),
        ("inner", 1, 2.0),
    ]
    with pytest.raises(VerifierConfigError, match="no verifier missing"):
        pin_composite({"parts": [{"name": "missing"}]}, resolve)
    with pytest.raises(VerifierConfigError, match="cycle"):
        pin_composite({"parts": [{"name": "loop"}]}, resolve)


def test_composite_scores_weighted_sum_and_names_failing_part():
    config = {
        "parts": [
            {"name": "inner", "version": 1, "weight": 2.0},
            {"name": "len", "version": 1, "weight": 1.0},
        ]
    }
    with open_verifier("composite", config, name="combo", resolve=resolve) as v:
        scores, errors = v.score([s("42", answer="42"), s("4", answer="42"), s("42")])
    assert scores[:2] == [3.0, 0.5] and errors[:2] == [None, None]
    assert scores[2] is None and errors[2].startswith("part inner@1:")
    with pytest.raises(VerifierConfigError, match="not pinned"):
        open_verifier("composite", {"parts": [{"name": "exact"}]}, resolve=resolve)


def test_python_refused_without_sandbox_unless_unsafe_is_allowed(monkeypatch):
    source = {"source": "def verify(prompt, completion):\n    return 1.0\n"}
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: False)
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    assert sandbox_mode() == "unavailable"
    with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        open_verifier("python", source)
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    assert sandbox_mode() == "unsafe-subprocess"
    with open_verifier("python", source) as v:
        assert v.score([s("x")]) == ([1.0], [None])
