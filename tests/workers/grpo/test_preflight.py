"""Pre-flight on the tiny model: the figures of one real step, and the warnings they raise."""

from __future__ import annotations

from pathlib import Path

from tests.workers.grpo.conftest import DigitScorer
from tests.workers.grpo.helpers import small_spec
from workers.grpo.preflight import preflight, preflight_warnings


class Constant:
    name, weight = "constant", 1.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        return [0.5] * len(samples), [None] * len(samples)


class Broken:
    name, weight = "broken", 1.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        return [None] * len(samples), ["ZeroDivisionError: boom"] * len(samples)


RECORDS = [{"prompt": f"Digit {d}:", "digit": d} for d in range(10)]


def test_constant_reward_is_all_zero_spread_and_fatal(tiny_model: Path) -> None:
    spec = small_spec(tiny_model, max_new_tokens=6, prompts_per_step=8)
    report = preflight(spec, RECORDS, [Constant()], prompts=4)
    assert report.zero_std_fraction == 1.0 and report.reward_std == 0.0
    assert report.reward_mean == 0.5 and report.verifier_error_rate == 0.0
    codes = {w.code: w.fatal for w in report.warnings}
    assert codes["all_groups_zero_spread"] is True
    assert report.prompts == 4 and len(report.samples) == 4 * 4
    # The measured step scaled to the job's 8 prompts: twice the time of the 4 it ran.
    assert report.step_seconds > 0
    assert abs(report.seconds_per_step_estimate - 2 * report.step_seconds) < 1e-9


def test_digit_reward_figures_agree_with_the_samples(tiny_model: Path) -> None:
    spec = small_spec(tiny_model, max_new_tokens=6, group_size=4, seed=3)
    report = preflight(spec, RECORDS, [DigitScorer()], prompts=4)
    groups: dict[int, list[float]] = {}
    for s in report.samples:
        groups.setdefault(s["group"], []).append(s["reward"])
    assert len(groups) == 4 and all(len(r) == 4 for r in groups.values())
    flat = sum(len(set(r)) == 1 for r in groups.values()) / len(groups)
    assert report.zero_std_fraction == flat
    rewards = [r for rs in groups.values() for r in rs]
    assert abs(report.reward_mean - sum(rewards) / len(rewards)) < 1e-6
    truncated = sum(s["truncated"] for s in report.samples) / len(report.samples)
    assert report.truncated_fraction == truncated
    assert report.reward_by_verifier.keys() == {"digit"}


def test_verifier_errors_are_counted_and_fatal(tiny_model: Path) -> None:
    spec = small_spec(tiny_model, max_new_tokens=4)
    report = preflight(spec, RECORDS, [DigitScorer(), Broken()], prompts=2)
    assert report.verifier_error_rate == 0.5  # every score of one verifier of two
    assert all(s["errors"] == {"broken": "ZeroDivisionError: boom"} for s in report.samples)
    assert {w.code for w in report.warnings if w.fatal} >= {"verifier_errors"}


def test_warning_thresholds() -> None:
    assert preflight_warnings(0.0, 0.05, 0.5) == []  # at the thresholds: nothing yet
    warned = {w.code: w.fatal for w in preflight_warnings(0.75, 0.06, 0.51)}
    assert warned == {"most_groups_zero_spread": False, "verifier_errors": True,
                      "most_truncated": False}  # fmt: skip
    assert [w.code for w in preflight_warnings(1.0, 0.0, 0.0)] == ["all_groups_zero_spread"]
