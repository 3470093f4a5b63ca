"""`evaluate_model` on the tiny model, no service: k completions per record in record order,
batched by whole groups, each scored by every scorer (reward = weighted sum, a failed score 0),
the tokens counted, and the same seed giving the same completions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.grpo.conftest import DigitScorer
from workers.grpo.config import GenerationParams
from workers.grpo.model_eval import MAX_BATCH_COMPLETIONS, evaluate_model
from workers.grpo.policy import BaseWeights


class FailsOnOdd:
    """A verifier that fails on every other sample (weight 2): its failures score 0."""

    name, weight = "flaky", 2.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        scores = [None if i % 2 else 0.5 for i in range(len(samples))]
        return scores, [("broken" if i % 2 else None) for i in range(len(samples))]


def _run(tiny_model: Path, seed: int) -> list:
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in range(5)]
    gen = GenerationParams(max_new_tokens=5)
    weights = BaseWeights(path=str(tiny_model), name="tiny")
    k = MAX_BATCH_COMPLETIONS // 2  # two records a batch: batches of 2, 2 and 1 records
    return list(evaluate_model(weights, records, [DigitScorer(), FailsOnOdd()], k, gen, seed))


def test_groups_scores_and_tokens(tiny_model: Path) -> None:
    batches = _run(tiny_model, seed=3)
    k = MAX_BATCH_COMPLETIONS // 2
    assert [len(b.rows) for b in batches] == [2 * k, 2 * k, k]
    rows = [r for b in batches for r in b.rows]
    assert [r["record"] for r in rows] == [i // k for i in range(5 * k)]
    assert [r["index"] for r in rows] == [i % k for i in range(5 * k)]
    for b in batches:
        assert b.completion_tokens == sum(r["length"] for r in b.rows) > 0
    for i, r in enumerate(rows):
        flaky = None if (i % (2 * k)) % 2 else 0.5  # each batch is one scoring call
        assert r["scores"]["flaky"] == flaky and ("flaky" in r["errors"]) == (flaky is None)
        assert r["reward"] == pytest.approx(r["scores"]["digit"] + 2.0 * (flaky or 0.0))
        assert r["prompt"].startswith(f"Digit {r['record']}:")
    assert len({r["completion"] for r in rows}) > 1  # sampled, not greedy


def test_same_seed_same_completions(tiny_model: Path) -> None:
    first = [r["completion"] for b in _run(tiny_model, seed=3) for r in b.rows]
    again = [r["completion"] for b in _run(tiny_model, seed=3) for r in b.rows]
    other = [r["completion"] for b in _run(tiny_model, seed=4) for r in b.rows]
    assert first == again and first != other
