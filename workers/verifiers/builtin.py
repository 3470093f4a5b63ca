"""Built-in verifier kinds. `open_verifier` runs them in a helper process with a per-batch
deadline (`builtin_host.py`): some of this work can spin in C on a tenant's input (the LaTeX
clean-up's backtracking below), and only a process can be stopped then."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from .base import BaseVerifier, Sample
from .config import ExactMatchConfig, LengthConfig, NumericConfig, RegexConfig


class _MissingField(Exception):
    pass


def _field(sample: Sample, name: str) -> Any:
    value = sample.get(name)
    if value is None:
        raise _MissingField(f"sample has no field {name!r}")
    return value


def _completion(sample: Sample) -> str:
    value = sample.get("completion")
    if not isinstance(value, str):
        raise TypeError(f"completion must be a string, not {type(value).__name__}")
    return value


class FunctionVerifier(BaseVerifier):
    """Scores each sample independently with `fn(sample) -> float`; exceptions become errors."""

    def __init__(self, name: str, fn: Callable[[Sample], float]):
        super().__init__(name)
        self._fn = fn

    def score(self, samples: list[Sample]) -> tuple[list[float | None], list[str | None]]:
        scores: list[float | None] = []
        errors: list[str | None] = []
        for sample in samples:
            try:
                if not isinstance(sample, dict):
                    raise TypeError(f"sample must be an object, not {type(sample).__name__}")
                value = float(self._fn(sample))
            except _MissingField as exc:
                scores.append(None)
                errors.append(str(exc))
            except Exception as exc:  # reported per item
                scores.append(None)
                errors.append(f"{type(exc).__name__}: {exc}"[:500])
            else:
                scores.append(value)
                errors.append(None)
        return scores, errors


# ----------------------------------------------------------------------------- exact_match

_WS = re.compile(r"\s+")


def exact_match(cfg: ExactMatchConfig) -> Callable[[Sample], float]:
    def norm(s: str) -> str:
        if cfg.normalize_whitespace:
            s = _WS.sub(" ", s)
        if cfg.strip or cfg.normalize_whitespace:
            s = s.strip()
        if not cfg.case_sensitive:
            s = s.casefold()
        return s

    def fn(sample: Sample) -> float:
        completion = _completion(sample)
        expected = _field(sample, cfg.field)
        return 1.0 if norm(completion) == norm(str(expected)) else 0.0

    return fn


# ----------------------------------------------------------------------------- regex


def regex(cfg: RegexConfig) -> Callable[[Sample], float]:
    pattern = cfg.compiled()
    match_fn = pattern.search if cfg.mode == "search" else pattern.fullmatch

    def fn(sample: Sample) -> float:
        completion = _completion(sample)
        expected = None if cfg.field is None else str(_field(sample, cfg.field))
        m = match_fn(completion)
        if m is None:
            return 0.0
        if expected is None:
            return 1.0
        return 1.0 if m.group(cfg.group) == expected else 0.0

    return fn


# ----------------------------------------------------------------------------- numeric

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(rf"(?<![\w.])([-−]?)({_NUM})(?:\s*/\s*({_NUM}))?")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")
_LATEX_NOISE = re.compile(r"\\[,;:!]|\\(?:left|right)\b|\\text\{[^{}]*\}|\\%|\$")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
        start = text.rfind("\\boxed", 0, start)
    return None


def _to_float(num: str) -> float:
    return float(num.replace(",", ""))


def last_number(text: str) -> float | None:
    """The last number in `text`: handles signs, decimals, thousands commas and a/b fractions."""
    text = text.replace("{,}", ",")
    text = _LATEX_FRAC.sub(r"\1/\2", text)
    text = _LATEX_NOISE.sub("", text)
    matches = list(_NUMBER_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    value = _to_float(m.group(2))
    if m.group(3) is not None:
        denom = _to_float(m.group(3))
        value = value / denom if denom != 0 else math.nan
    return -value if m.group(1) else value


def extract_answer(completion: str) -> float | None:
    """The last \\boxed{} answer if present, else the last number in the completion."""
    boxed = last_boxed(completion)
    return last_number(boxed if boxed is not None else completion)


def _target_number(value: Any, field: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"field {field!r} is not a number: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return _to_float(value.strip())
        except ValueError:
            pass
        parsed = extract_answer(value)
        if parsed is not None:
            return parsed
    raise ValueError(f"field {field!r} is not a number: {str(value)[:100]!r}")


def numeric(cfg: NumericConfig) -> Callable[[Sample], float]:
    def fn(sample: Sample) -> float:
        completion = _completion(sample)
        target = _target_number(_field(sample, cfg.field), cfg.field)
        got = extract_answer(completion)
        if got is None or not math.isfinite(got):
            return 0.0
        diff = abs(got - target)
        limit = cfg.tolerance * abs(target) if cfg.relative else cfg.tolerance
        return 1.0 if got == target or diff <= limit else 0.0

    return fn


# ----------------------------------------------------------------------------- length


def length(cfg: LengthConfig) -> Callable[[Sample], float]:
    def fn(sample: Sample) -> float:
        n = len(_completion(sample))
        return max(0.0, 1.0 - cfg.penalty * abs(n - cfg.target))

    return fn


BUILDERS: dict[str, Callable[[Any], Callable[[Sample], float]]] = {
    "exact_match": exact_match,
    "regex": regex,
    "numeric": numeric,
    "length": length,
}
