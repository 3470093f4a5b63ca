import pytest

from workers.verifiers import Verifier, open_verifier
from workers.verifiers.builtin import extract_answer, last_boxed


def run(kind: str, config: dict, samples: list[dict]):
    with open_verifier(kind, config, name=kind) as v:
        assert isinstance(v, Verifier)
        assert v.name == kind
        return v.score(samples)


def s(completion, **fields):
    return {"prompt": "q", "completion": completion, **fields}


# ----------------------------------------------------------------------------- exact_match


def test_exact_match_defaults():
    scores, errors = run(
        "exact_match",
        {},
        [
            s(" 42\n", answer="42"),
            s("42", answer="43"),
            s("Paris", answer="paris"),
            s("7", answer=7),
        ],
    )
    assert scores == [1.0, 0.0, 0.0, 1.0]
    assert errors == [None] * 4


def test_exact_match_options():
    cfg = {"case_sensitive": False, "normalize_whitespace": True, "field": "gold"}
    scores, _ = run(
        "exact_match", cfg, [s("New   York\n", gold="new york"), s("NewYork", gold="new york")]
    )
    assert scores == [1.0, 0.0]
    scores, _ = run("exact_match", {"strip": False}, [s(" 42", answer="42"), s("42", answer="42")])
    assert scores == [0.0, 1.0]


def test_exact_match_missing_field_is_error():
    scores, errors = run("exact_match", {}, [s("42"), s("42", answer="42")])
    assert scores == [None, 1.0]
    assert "answer" in errors[0] and errors[1] is None


def test_non_string_completion_is_error():
    scores, errors = run("exact_match", {}, [{"prompt": "q", "completion": None, "answer": "1"}])
    assert scores == [None] and "completion" in errors[0]


# ----------------------------------------------------------------------------- regex


def test_regex_search_and_fullmatch():
    samples = [s("the answer is 42"), s("42"), s("nothing")]
    assert run("regex", {"pattern": r"\d+"}, samples)[0] == [1.0, 1.0, 0.0]
    assert run("regex", {"pattern": r"\d+", "mode": "fullmatch"}, samples)[0] == [0.0, 1.0, 0.0]


def test_regex_flags():
    cfg = {"pattern": r"^answer: yes$", "flags": ["IGNORECASE", "MULTILINE"]}
    assert run("regex", cfg, [s("think\nANSWER: Yes\nbye"), s("answer: no")])[0] == [1.0, 0.0]


def test_regex_group_and_field():
    cfg = {"pattern": r"Answer:\s*(-?\d+)", "field": "answer", "group": 1}
    samples = [s("Answer: 12", answer=12), s("Answer: 13", answer="12"), s("no answer", answer="1")]
    scores, errors = run("regex", cfg, samples)
    assert scores == [1.0, 0.0, 0.0] and errors == [None] * 3
    named = {"pattern": r"<(?P<ans>\w+)>", "field": "answer", "group": "ans"}
    assert run("regex", named, [s("x <abc> y", answer="abc")])[0] == [1.0]
    # a group that did not take part in the match is not equal to anything
    optional = {"pattern": r"a(b)?", "field": "answer", "group": 1}
    assert run("regex", optional, [s("a", answer="b")])[0] == [0.0]


def test_regex_missing_field_is_error():
    cfg = {"pattern": r"(\d+)", "field": "answer", "group": 1}
    scores, errors = run("regex", cfg, [s("5")])
    assert scores == [None] and "answer" in errors[0]


# ----------------------------------------------------------------------------- numeric


@pytest.mark.parametrize(
    "text, value",
    [
        ("so the answer is \\boxed{42}.", 42.0),
        ("first 3 then \\boxed{7} and 9", 7.0),
        ("\\boxed{1} then \\boxed{\\frac{3}{4}}", 0.75),
        ("\\boxed{-\\dfrac{1}{2}}", -0.5),
        ("\\boxed{1{,}000}", 1000.0),
        ("\\boxed{x = 5}", 5.0),
        ("there are 12 apples and 3 pears, so 15", 15.0),
        ("it costs $1,234.50 in total.", 1234.5),
        ("temperature is -3.5 degrees", -3.5),
        ("the ratio is 3/4", 0.75),
        ("the ratio is -3 / 4", -0.75),
        ("answer: 2.5e3", 2500.0),
        ("from 3-5 items", 5.0),
        ("x=-7", -7.0),
        ("2, 3, 4", 4.0),
        ("no numbers here", None),
        ("\\boxed{\\text{none}}", None),
    ],
)
def test_extract_answer(text, value):
    assert extract_answer(text) == value


def test_last_boxed_nested():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("unclosed \\boxed{3") is None


def test_numeric_scores():
    samples = [
        s("The answer is \\boxed{72}", answer="72"),
        s("I think it's 71", answer=72),
        s("so 1,000", answer="1000"),
        s("half: 1/2", answer=0.5),
        s("no idea", answer="3"),  # no number: 0.0, not an error
        s("\\boxed{3/4}", answer="\\frac{3}{4}"),
    ]
    scores, errors = run("numeric", {}, samples)
    assert scores == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert errors == [None] * len(samples)


def test_numeric_tolerance():
    samples = [s("3.14159", answer="3.1416"), s("3.2", answer="3.1416")]
    assert run("numeric", {}, samples)[0] == [0.0, 0.0]
    assert run("numeric", {"tolerance": 1e-3}, samples)[0] == [1.0, 0.0]
    rel = [s("1010", answer=1000), s("1020", answer=1000)]
    assert run("numeric", {"tolerance": 0.015, "relative": True}, rel)[0] == [1.0, 0.0]


def test_numeric_bad_or_missing_field_is_error():
    scores, errors = run("numeric", {}, [s("5"), s("5", answer="five"), s("5", answer=True)])
    assert scores == [None, None, None]
    assert all("answer" in e for e in errors)


# ----------------------------------------------------------------------------- length


def test_length():
    cfg = {"target": 10, "penalty": 0.1}
    samples = [s("x" * 10), s("x" * 7), s("x" * 13), s("x" * 100), s("")]
    scores, errors = run("length", cfg, samples)
    assert scores == pytest.approx([1.0, 0.7, 0.7, 0.0, 0.0])
    assert errors == [None] * 5
    assert run("length", {"target": 2}, [s("abcd")])[0] == pytest.approx([0.98])
