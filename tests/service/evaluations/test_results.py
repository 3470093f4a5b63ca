"""An evaluation's results say why pass@k is 0 when no sample passed: the threshold against the
best reward seen (a partial-credit verifier never reaching 1.0)."""

from __future__ import annotations

from service.evaluations.results import summarize


def _samples(rewards: list[float]) -> list[dict]:
    return [
        {"record": i // 2, "reward": r, "scores": {"v": r}, "errors": {}, "length": 3}
        for i, r in enumerate(rewards)
    ]


def test_no_sample_passing_says_why() -> None:
    results = summarize(_samples([0.2, 0.6, 0.0, 0.4]), 2, 1.0)
    assert results["pass_at_k"]["1"]["estimate"] == 0.0 and results["best_reward"] == 0.6
    assert results["none_passed"].startswith("no completion reached pass_threshold 1: the best")
    assert "0.6" in results["none_passed"]


def test_a_passing_sample_needs_no_reason() -> None:
    results = summarize(_samples([0.2, 0.6, 0.0, 0.4]), 2, 0.5)
    assert results["pass_at_k"]["1"]["estimate"] == 0.25 and results["none_passed"] is None
