"""The `openai_grader` verifier kind at run time: an OpenAI grader object as a Verifier.

- `string_check`, `text_similarity`: built-in scoring (`grader_scoring.py`) in the helper
  process of `builtin_host.py`, under its per-batch deadline, like every built-in kind.
- `python`: `grade(sample, item)` in the python verifier sandbox (`python_kind.py`), whose
  bootstrap already calls OpenAI-style graders with `sample = {output_text, output_json, ...}`
  and `item` = the record.
- `score_model`, `label_model`: a model judge (`judge.py`), called from this process through the
  opener's JudgeContext, never from the sandbox.
- `multi`: each sub-grader opened as above, their scores combined per item by
  `calculate_output` (`grader_expression.py`: float arithmetic over a checked tree, bounded by
  the expression's size, so it runs here).
"""

from __future__ import annotations

import ast
from contextlib import ExitStack
from typing import Any

from .base import BaseVerifier, Sample, ScoreResult, Verifier
from .builtin_host import BuiltinHost, HostedVerifier
from .config import PythonConfig
from .grader_config import Grader, MultiGrader, PythonGrader
from .grader_expression import evaluate, parse_expression
from .judge import JudgeContext, open_judge
from .judge_config import LabelModelGrader, ScoreModelGrader
from .python_kind import ChildLimits, PythonVerifier

KIND = "openai_grader"
# OpenAI does not bound a python grader's score; ours clamps to a range only against absurd
# values that would swamp a batch's advantages.
PYTHON_SCORE_RANGE = [-1e6, 1e6]


class MultiGraderVerifier(BaseVerifier):
    """calculate_output over the sub-graders' scores; an item any sub-grader failed on is an
    error naming that sub-grader."""

    def __init__(
        self, name: str, parts: dict[str, Verifier], expression: ast.Expression, stack: ExitStack
    ) -> None:
        super().__init__(name)
        self.parts, self._expression, self._stack = parts, expression, stack

    def score_parts(self, samples: list[Sample]) -> tuple[ScoreResult, list[dict[str, float]]]:
        """The combined scores and errors, and each item's sub-grader scores by key."""
        n = len(samples)
        by_item: list[dict[str, float]] = [{} for _ in range(n)]
        errors: list[str | None] = [None] * n
        for key, verifier in self.parts.items():
            scores, errs = verifier.score(samples)
            for i in range(n):
                if errs[i] is not None or scores[i] is None:
                    errors[i] = errors[i] or f"grader {key}: {errs[i] or 'no score'}"[:500]
                else:
                    by_item[i][key] = float(scores[i])  # type: ignore[arg-type]
        totals: list[float | None] = [None] * n
        for i in range(n):
            if errors[i] is None:
                try:
                    totals[i] = evaluate(self._expression, by_item[i])
                except (ArithmeticError, ValueError) as exc:
                    errors[i] = f"calculate_output: {type(exc).__name__}: {exc}"[:500]
        return (totals, errors), by_item

    def score(self, samples: list[Sample]) -> ScoreResult:
        return self.score_parts(samples)[0]

    def close(self) -> None:
        self._stack.close()


def open_grader(
    grader: Grader,
    name: str,
    host: BuiltinHost,
    limits: ChildLimits | None = None,
    judges: JudgeContext | None = None,
) -> Verifier:
    """A runnable verifier for a validated grader; built-in parts score on `host`, model
    judges through `judges`."""
    if isinstance(grader, ScoreModelGrader | LabelModelGrader):
        return open_judge(grader, name, judges)
    if isinstance(grader, PythonGrader):
        config = PythonConfig(source=grader.source, score_range=PYTHON_SCORE_RANGE)
        return PythonVerifier(name, config, limits=limits)
    if isinstance(grader, MultiGrader):
        with ExitStack() as stack:
            parts = {
                key: stack.enter_context(open_grader(sub, f"{name}/{key}", host, limits, judges))
                for key, sub in grader.sub_graders.items()
            }
            expression = parse_expression(grader.calculate_output, grader.sub_graders)
            return MultiGraderVerifier(name, parts, expression, stack.pop_all())
    dumped: dict[str, Any] = grader.model_dump(mode="json")
    return HostedVerifier(name, KIND, dumped, host, owns_host=False)
