import subprocess
import sys

import pytest

from workers.verifiers import KINDS, VerifierConfigError, validate_config

GOOD_SOURCE = "def verify(prompt, completion, **fields):\n    return 1.0\n"


def paths(exc: VerifierConfigError) -> list[tuple]:
    return [p for p, _ in exc.errors]


def error_for(kind: str, config: dict) -> VerifierConfigError:
    with pytest.raises(VerifierConfigError) as info:
        validate_config(kind, config)
    assert isinstance(info.value, ValueError)
    return info.value


def test_kinds():
    assert KINDS == (
        "python",
        "exact_match",
        "regex",
        "numeric",
        "json_schema",
        "length",
        "composite",
        "openai_grader",
        "judge",
    )


def test_unknown_kind():
    exc = error_for("json_schema_v9", {})
    assert paths(exc) == [("kind",)]
    assert "unknown verifier kind" in exc.errors[0][1]


def test_config_must_be_object():
    exc = error_for("length", ["target", 3])  # type: ignore[arg-type]
    assert paths(exc) == [()]


# ----------------------------------------------------------------------------- python


def test_python_defaults():
    cfg = validate_config("python", {"source": GOOD_SOURCE})
    assert cfg == {
        "source": GOOD_SOURCE,
        "timeout_s": 10.0,
        "score_range": [0.0, 1.0],
        "budget_s": 600.0,
        "max_failures": 10,
    }
    # normalised configs validate again unchanged
    assert validate_config("python", cfg) == cfg


def test_python_accepts_grade_and_assignment_forms():
    validate_config("python", {"source": "def grade(sample, item):\n    return 1.0\n"})
    validate_config("python", {"source": "verify = lambda prompt, completion, **kw: 0.5\n"})
    validate_config("python", {"source": "try:\n    def verify(p, c):\n        return 1\nexcept"
                               " Exception:\n    pass\n"})  # fmt: skip


def test_python_syntax_error_reports_line():
    src = "import re\n\ndef verify(prompt, completion:\n    return 1.0\n"
    exc = error_for("python", {"source": src})
    assert paths(exc) == [("source",)]
    msg = exc.errors[0][1]
    assert msg.startswith("SyntaxError")
    assert "(line 3)" in msg


def test_python_indentation_error_reports_line():
    src = "def verify(prompt, completion):\nreturn 1.0\n"
    msg = error_for("python", {"source": src}).errors[0][1]
    assert msg.startswith("IndentationError") and "(line 2)" in msg


def test_python_compile_only_errors_are_caught():
    # `return` outside a function parses but does not compile
    msg = error_for("python", {"source": "def verify(p, c):\n    return 1\nreturn 2\n"}).errors[0][
        1
    ]
    assert "SyntaxError" in msg and "line 3" in msg


def test_python_without_verify():
    exc = error_for("python", {"source": "def check(prompt, completion):\n    return 1.0\n"})
    assert paths(exc) == [("source",)]
    assert "verify" in exc.errors[0][1]


def test_python_verify_inside_function_does_not_count():
    src = "def outer():\n    def verify(p, c):\n        return 1\n"
    assert paths(error_for("python", {"source": src})) == [("source",)]


def test_python_async_verify_rejected():
    src = "async def verify(p, c):\n    return 1\n"
    assert "async" in error_for("python", {"source": src}).errors[0][1]


def test_python_source_too_large():
    src = GOOD_SOURCE + "#" * (256 * 1024)
    exc = error_for("python", {"source": src})
    assert paths(exc) == [("source",)]
    assert "256 kB" in exc.errors[0][1]


def test_python_source_just_under_limit_ok():
    src = GOOD_SOURCE + "#" * (256 * 1024 - len(GOOD_SOURCE) - 1) + "\n"
    validate_config("python", {"source": src})


def test_python_does_not_execute_source(tmp_path):
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w').write('x')\ndef verify(p, c):\n    return 1\n"
    validate_config("python", {"source": src})
    assert not marker.exists()


def test_python_every_bad_field_listed():
    exc = error_for(
        "python",
        {"source": "def nope(:", "timeout_s": 0, "score_range": [1, 0], "memory": 5},
    )
    assert set(paths(exc)) == {("source",), ("timeout_s",), ("score_range",), ("memory",)}


@pytest.mark.parametrize(
    "config, path",
    [
        ({}, ("source",)),
        ({"source": 5}, ("source",)),
        ({"source": GOOD_SOURCE, "timeout_s": -1}, ("timeout_s",)),
        ({"source": GOOD_SOURCE, "timeout_s": 301}, ("timeout_s",)),
        ({"source": GOOD_SOURCE, "timeout_s": "10"}, ("timeout_s",)),
        ({"source": GOOD_SOURCE, "score_range": [0]}, ("score_range",)),
        ({"source": GOOD_SOURCE, "score_range": [0, float("inf")]}, ("score_range", 1)),
        ({"source": GOOD_SOURCE, "score_range": [2, 2]}, ("score_range",)),
    ],
)
def test_python_invalid_fields(config, path):
    assert path in paths(error_for("python", config))


# ----------------------------------------------------------------------------- builtins


def test_exact_match_defaults_and_errors():
    assert validate_config("exact_match", {}) == {
        "field": "answer",
        "strip": True,
        "case_sensitive": True,
        "normalize_whitespace": False,
    }
    exc = error_for("exact_match", {"strip": "yes", "feild": "x"})
    assert set(paths(exc)) == {("strip",), ("feild",)}


def test_regex_valid():
    cfg = validate_config("regex", {"pattern": r"(?P<ans>\d+)", "group": "ans", "field": "a"})
    assert cfg == {
        "pattern": r"(?P<ans>\d+)",
        "mode": "search",
        "field": "a",
        "group": "ans",
        "flags": [],
    }
    validate_config("regex", {"pattern": "x", "mode": "fullmatch", "flags": ["IGNORECASE"]})


def test_regex_bad_pattern_reports_re_error():
    exc = error_for("regex", {"pattern": "(abc"})
    assert paths(exc) == [("pattern",)]
    assert exc.errors[0][1].startswith("invalid pattern: missing )")


@pytest.mark.parametrize(
    "config, path",
    [
        ({}, ("pattern",)),
        ({"pattern": "a", "mode": "match"}, ("mode",)),
        ({"pattern": "a", "flags": ["VERBOSE"]}, ("flags", 0)),
        ({"pattern": "(a)", "group": 2}, ("group",)),
        ({"pattern": "(?P<x>a)", "group": "y"}, ("group",)),
        ({"pattern": "(a)", "group": -1}, ("group",)),
        ({"pattern": "(a)", "group": True}, ("group",)),
        ({"pattern": "(a)", "group": 1.0}, ("group",)),
        ({"pattern": "(a", "mode": "x"}, ("mode",)),
        ({"pattern": "(a", "mode": "x"}, ("pattern",)),
    ],
)
def test_regex_invalid_fields(config, path):
    assert path in paths(error_for("regex", config))


def test_numeric():
    assert validate_config("numeric", {}) == {
        "field": "answer",
        "tolerance": 1e-6,
        "relative": False,
    }
    assert paths(error_for("numeric", {"tolerance": -1})) == [("tolerance",)]
    assert paths(error_for("numeric", {"relative": 1})) == [("relative",)]


def test_length():
    assert validate_config("length", {"target": 10}) == {
        "target": 10,
        "penalty": 0.01,
        "unit": "chars",
    }
    assert paths(error_for("length", {})) == [("target",)]
    assert paths(error_for("length", {"target": 5, "unit": "tokens"})) == [("unit",)]
    assert paths(error_for("length", {"target": -1})) == [("target",)]
    assert paths(error_for("length", {"target": 1.5})) == [("target",)]


def test_error_message_lists_fields():
    exc = error_for("length", {"target": "x", "penalty": -1})
    assert "target" in str(exc) and "penalty" in str(exc)


def test_import_is_light():
    code = (
        "import sys, workers.verifiers as v\n"
        "v.validate_config('length', {'target': 1})\n"
        "bad = [m for m in ('torch', 'fastapi', 'celery') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
