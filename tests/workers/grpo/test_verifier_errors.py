"""The verifier-error watch (`workers.grpo.verifier_errors`): every score failing fails the run at
once, more than half failing for three steps fails it, fewer give one warning per streak; the
failure and the warning carry the first error and its completion. Through `train` too."""

from __future__ import annotations

import pytest

from tests.workers.grpo.test_trainer import Recorder, _spec
from workers.grpo.trainer import VerifiersFailing, train
from workers.grpo.verifier_errors import (
    FirstFailure,
    VerifierErrorWatch,
    error_share,
    first_failure,
)

FIRST = FirstFailure("math", "KeyError: 'answer'", "The answer is 5")


def test_the_share_counts_every_verifier_over_the_scored_completions() -> None:
    metrics = {"errors/a": 4.0, "errors/b": 0.0, "scored_completions": 8.0, "loss": 1.0}
    assert error_share(metrics) == 0.25
    assert error_share({"scored_completions": 8.0}) == 0.0
    errors = {"a": [None, None], "b": [None, "boom"]}
    assert first_failure(errors, ["x", "y"]) == FirstFailure("b", "boom", "y")
    assert first_failure({"a": [None]}, ["x"]) is None


def test_every_score_failing_fails_at_once_naming_the_error_and_completion() -> None:
    with pytest.raises(VerifiersFailing) as failed:
        VerifierErrorWatch().observe(1, 1.0, FIRST)
    text = str(failed.value)
    assert "step 1: every score failed" in text and "KeyError: 'answer'" in text
    assert "'The answer is 5'" in text and "grpo verifiers test" in text


def test_a_high_share_fails_after_its_steps_a_low_one_warns_once_per_streak() -> None:
    watch = VerifierErrorWatch()
    message, data = watch.observe(1, 0.2, FIRST)  # type: ignore[misc]
    assert "20% of the scores failed" in message and data["first_error"] == "KeyError: 'answer'"
    assert watch.observe(2, 0.3, FIRST) is None  # said once per streak
    assert watch.observe(3, 0.0, None) is None  # the streak ends
    assert watch.observe(4, 0.6, FIRST) is not None  # a new streak is said again
    assert watch.observe(5, 0.6, FIRST) is None
    with pytest.raises(VerifiersFailing, match=r"steps 4-6: more than 50% .* \(70% at the last\)"):
        watch.observe(6, 0.7, FIRST)


class Failing:
    name = "math"
    weight = 1.0

    def score(self, samples):
        return [None] * len(samples), ["KeyError: 'answer'"] * len(samples)


def test_a_run_whose_verifier_always_fails_stops_at_its_first_step(
    tiny_model, digit_records, tmp_path
) -> None:
    hooks = Recorder()
    with pytest.raises(VerifiersFailing, match=r"step 1: every score failed.*verifier 'math'"):
        train(_spec(tiny_model, steps=3, max_new_tokens=4), digit_records, [Failing()],
              tmp_path, hooks)  # fmt: skip
    assert hooks.metrics == {}
