"""The verifier-error watch: a run whose verifiers cannot score teaches nothing, and says so.

A failed score (an exception, a timeout, a non-finite value) counts 0 in the reward, so a
verifier that fails on every completion gives every group equal rewards: advantages 0, no
gradient, and a job that would still end `succeeded`. The watch, after each step, on the share
of failed scores (every verifier's `errors/<name>` over scored completions x verifiers):

- every score of the step failed: the run fails at once (`VerifiersFailing`);
- more than MAX_ERROR_SHARE for ERROR_STEPS consecutive steps: the run fails;
- any smaller share: one `warning` event per streak of steps with errors.

The failure and the warning carry the first error and the completion it was given, so the job's
`error` says what went wrong without a look at its events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_ERROR_SHARE = 0.5
ERROR_STEPS = 3
SAMPLE_CHARS = 300


class VerifiersFailing(RuntimeError):
    """The verifiers failed on every completion of a step, or on more than MAX_ERROR_SHARE of
    them for ERROR_STEPS steps: the run cannot learn."""


@dataclass(frozen=True)
class FirstFailure:
    """A step's first failed score: which verifier, its error, the completion it scored."""

    verifier: str
    error: str
    completion: str

    def describe(self) -> str:
        sample = self.completion[:SAMPLE_CHARS] + (
            "…" if len(self.completion) > SAMPLE_CHARS else ""
        )
        return f"verifier {self.verifier!r}: {self.error} (on the completion {sample!r})"


def first_failure(errors: dict[str, list[str | None]], texts: list[str]) -> FirstFailure | None:
    """The first failed score of a batch (`errors`: verifier -> N error texts, None for a
    score), with its completion; None when every score was valid."""
    for name, per_completion in errors.items():
        for i, error in enumerate(per_completion):
            if error is not None:
                return FirstFailure(name, error, texts[i] if i < len(texts) else "")
    return None


def error_share(metrics: dict[str, float]) -> float:
    """Failed scores over scored completions x verifiers, from a step's metrics."""
    failed = [v for k, v in metrics.items() if k.startswith("errors/")]
    scored = metrics.get("scored_completions", 0.0) * len(failed)
    return sum(failed) / scored if scored else 0.0


@dataclass
class VerifierErrorWatch:
    max_share: float = MAX_ERROR_SHARE
    steps: int = ERROR_STEPS
    over: int = 0  # consecutive steps over max_share
    warned: bool = False  # in this streak of steps with errors

    def observe(
        self, step: int, share: float, first: FirstFailure | None
    ) -> tuple[str, dict[str, Any]] | None:
        """The `warning` event of a step (message, data), or None; raises VerifiersFailing."""
        where = f": {first.describe()}" if first is not None else ""
        if share >= 1.0:
            raise VerifiersFailing(
                f"step {step}: every score failed, so no completion can be told from another"
                f"{where}. Check the verifier with `grpo verifiers test` on a record of the dataset"
            )
        if share <= 0.0:
            self.over, self.warned = 0, False
            return None
        self.over = self.over + 1 if share > self.max_share else 0
        if self.over >= self.steps:
            raise VerifiersFailing(
                f"steps {step - self.steps + 1}-{step}: more than {self.max_share:.0%} of the "
                f"scores failed at each step ({share:.0%} at the last){where}"
            )
        if self.warned:
            return None
        self.warned = True
        message = f"step {step}: {share:.0%} of the scores failed (counted 0){where}"
        data: dict[str, Any] = {"reason": "verifier_errors", "step": step, "error_share": share}
        if first is not None:
            data |= {"verifier": first.verifier, "first_error": first.error,
                     "completion": first.completion[:SAMPLE_CHARS]}  # fmt: skip
        return message, data
