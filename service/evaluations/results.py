"""An evaluation's `results` from its samples: the mean reward, each verifier's mean score and
pass@k for k = 1, 2, 4, ... <= samples_per_prompt (`pass_at_k`, a sample passes when its reward
is at least the threshold). Pure: the worker computes them once, the API only stores them."""

from __future__ import annotations

import math
from typing import Any

from service.evaluations.pass_at_k import pass_at_k, passes, verifier_means


def summarize(samples: list[dict[str, Any]], samples_per_prompt: int, threshold: float) -> dict:
    """`samples` as the engine's rows (record, reward, scores, errors, length), record by record
    with each record's `samples_per_prompt` samples consecutive."""
    by_record: dict[int, list[float]] = {}
    for s in samples:
        by_record.setdefault(s["record"], []).append(s["reward"])
    groups = [by_record[r] for r in sorted(by_record)]
    if not groups or any(len(g) != samples_per_prompt for g in groups):
        raise ValueError(f"every record needs {samples_per_prompt} samples")
    estimates = pass_at_k(passes(groups, threshold))
    return {
        "reward_mean": math.fsum(s["reward"] for s in samples) / len(samples),
        "per_verifier": verifier_means([s["scores"] for s in samples]),
        "pass_at_k": {
            str(e.k): {"estimate": e.value, "low": e.low, "high": e.high} for e in estimates
        },
        "samples": len(samples),
        "prompts": len(groups),
        "completion_tokens": sum(int(s["length"]) for s in samples),
        "verifier_errors": sum(len(s["errors"]) for s in samples),
        "best_reward": max(s["reward"] for s in samples),
        "none_passed": _none_passed(samples, threshold),
    }


def _none_passed(samples: list[dict[str, Any]], threshold: float) -> str | None:
    """Why pass@k is 0 everywhere, when no sample passed: the threshold against the best reward
    seen (a partial-credit verifier never reaches 1.0); None when some sample passed."""
    best = max(s["reward"] for s in samples)
    if best >= threshold:
        return None
    return (
        f"no completion reached pass_threshold {threshold:g}: the best reward seen was "
        f"{best:.3g}; with a verifier that gives partial credit, set pass_threshold to the "
        "reward that counts as solved"
    )
