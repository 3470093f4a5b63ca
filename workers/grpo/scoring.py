"""Rewards of GRPO step 3: r_i = sum_k w_k * score_k(y_i) over every verifier k.

A verifier error (a None score, or a non-finite one) scores 0 for that completion and is counted
(`errors/<name>`); it is reported through `on_event`, it never stops the run. An exception raised
by a scorer (e.g. its sandbox budget is spent) propagates and fails the job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard

import torch
from torch import Tensor


class Scorer(Protocol):
    """A verifier: per-sample score (None on error) and error text (None if ok)."""

    name: str
    weight: float

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]: ...


def _valid(score: float | None) -> TypeGuard[float]:
    return score is not None and math.isfinite(score)


@dataclass
class Scored:
    """A batch's rewards, its metrics, and what each verifier said of each completion."""

    rewards: Tensor  # (N,)
    metrics: dict[str, float]
    scores: dict[str, list[float | None]]  # verifier name -> N scores (None: no valid score)
    errors: dict[str, list[str | None]]  # verifier name -> N error texts (None: no error)


def score_completions(
    scorers: Sequence[Scorer],
    batch: list[dict],
    texts: list[str],
    group_size: int,
    on_event: Callable[[str, str, dict], None],
) -> tuple[Tensor, dict[str, float]]:
    """Rewards (N,) for the N = len(batch) * group_size completions, and reward/error metrics."""
    scored = score_batch(scorers, batch, texts, group_size, on_event)
    return scored.rewards, scored.metrics


def score_batch(
    scorers: Sequence[Scorer],
    batch: list[dict],
    texts: list[str],
    group_size: int,
    on_event: Callable[[str, str, dict], None],
) -> Scored:
    """`score_completions`, keeping each completion's scores and errors (for its rollout row)."""
    samples = [
        {**rec, "completion": text}
        for i, rec in enumerate(batch)
        for text in texts[i * group_size : (i + 1) * group_size]
    ]
    rewards, metrics = torch.zeros(len(samples)), {}  # (N,)
    per_score: dict[str, list[float | None]] = {}
    per_error: dict[str, list[str | None]] = {}
    for scorer in scorers:
        scores, errors = scorer.score(samples)
        if len(scores) != len(samples):
            n, want = len(scores), len(samples)
            raise ValueError(f"verifier {scorer.name!r} returned {n} scores for {want} samples")
        values = torch.tensor([float(s) if _valid(s) else 0.0 for s in scores])  # (N,)
        rewards += scorer.weight * values  # (N,)
        failed = [i for i, s in enumerate(scores) if not _valid(s)]
        per_score[scorer.name] = [float(s) if _valid(s) else None for s in scores]
        per_error[scorer.name] = [
            None if _valid(s) else _error_text(errors, i) for i, s in enumerate(scores)
        ]
        metrics[f"reward/{scorer.name}"] = values.mean().item()
        metrics[f"errors/{scorer.name}"] = float(len(failed))
        if failed:
            first = _error_text(errors, failed[0])
            on_event(
                "verifier_errors",
                f"verifier {scorer.name!r} failed on {len(failed)}/{len(samples)} completions",
                {"verifier": scorer.name, "count": len(failed), "first_error": first},
            )
    return Scored(rewards, metrics, per_score, per_error)


def _error_text(errors: list[str | None], i: int) -> str:
    return (errors[i] if i < len(errors) else None) or "no valid score"
