"""A judge model's answer read as a score or a label: pure functions, so that what counts as
garbage is testable without a model.

- score: the first number in the answer (`7`, `-0.5`, `8/10` reads 8, `1e3` reads 1000),
  clamped to the judge's range. No number, or one that is not finite: a JudgeAnswerError.
- label: the answer is the label (case and surrounding punctuation ignored), else the label
  whose first whole-word occurrence comes earliest. No label in it: a JudgeAnswerError.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_SHOWN = 200


class JudgeAnswerError(ValueError):
    """The judge's answer holds no score or label (an error for that item only)."""


def _shown(answer: str) -> str:
    text = answer.strip().replace("\n", " ")
    return repr(text[:_SHOWN] + ("..." if len(text) > _SHOWN else ""))


def parse_score(answer: str, lo: float, hi: float) -> float:
    """The first number of `answer`, clamped to [lo, hi]."""
    found = _NUMBER.search(answer)
    if found is None:
        raise JudgeAnswerError(f"the judge's answer holds no number: {_shown(answer)}")
    value = float(found.group())
    if not math.isfinite(value):
        raise JudgeAnswerError(f"the judge's number is not finite: {_shown(answer)}")
    return min(max(value, lo), hi)


def parse_label(answer: str, labels: list[str]) -> str:
    """The label `answer` gives: the whole answer, else the earliest one named in it."""
    bare = answer.strip().strip(" \t\r\n.,;:!?\"'`*()[]").casefold()
    for label in labels:
        if bare == label.casefold():
            return label
    best: tuple[int, str] | None = None
    for label in labels:
        pattern = r"(?<!\w)" + re.escape(label.casefold()) + r"(?!\w)"
        hit = re.search(pattern, answer.casefold())
        if hit is not None and (best is None or hit.start() < best[0]):
            best = (hit.start(), label)
    if best is None:
        raise JudgeAnswerError(f"the judge's answer names none of the labels: {_shown(answer)}")
    return best[1]
