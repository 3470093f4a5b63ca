"""pass@k against a brute-force count over every k-subset of the samples."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from itertools import combinations

import pytest

from service.evaluations.pass_at_k import (
    Z_95,
    ks_for,
    mean_interval,
    pass_at_k,
    pass_at_k_one,
    passes,
    verifier_means,
)


def brute_force(outcomes: list[bool], k: int) -> Fraction:
    """The share of k-subsets of the samples that hold at least one pass."""
    subsets = list(combinations(range(len(outcomes)), k))
    hits = sum(any(outcomes[i] for i in subset) for subset in subsets)
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", range(1, 11))
def test_one_prompt_matches_the_brute_force_count(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        random.Random(n * 100 + c).shuffle(outcomes)  # where the passes sit does not matter
        for k in range(1, n + 1):
            assert pass_at_k_one(n, c, k) == pytest.approx(float(brute_force(outcomes, k)),
                                                           abs=1e-12)  # fmt: skip


def test_edges_and_large_n() -> None:
    assert pass_at_k_one(5, 0, 3) == 0.0 and pass_at_k_one(5, 5, 1) == 1.0
    assert pass_at_k_one(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate
    assert pass_at_k_one(8, 6, 3) == 1.0  # only 2 failures: every 3 samples hold a pass
    exact = 1 - Fraction(math.comb(1000 - 7, 64), math.comb(1000, 64))
    assert pass_at_k_one(1000, 7, 64) == pytest.approx(float(exact), rel=1e-12)
    for bad in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError):
            pass_at_k_one(*bad)


def test_ks_are_one_and_powers_of_two_up_to_n() -> None:
    assert ks_for(1) == [1] and ks_for(2) == [1, 2] and ks_for(7) == [1, 2, 4]
    assert ks_for(16) == [1, 2, 4, 8, 16] and ks_for(20) == [1, 2, 4, 8, 16]


def test_many_prompts_average_the_brute_force_with_an_interval() -> None:
    rng = random.Random(0)
    prompts = [[rng.random() < p for _ in range(8)] for p in (0.1, 0.3, 0.5, 0.9, 0.0, 1.0)]
    estimates = pass_at_k(prompts)
    assert [e.k for e in estimates] == [1, 2, 4, 8]
    for e in estimates:
        per_prompt = [float(brute_force(p, e.k)) for p in prompts]
        mean = sum(per_prompt) / len(per_prompt)
        sd = math.sqrt(sum((v - mean) ** 2 for v in per_prompt) / (len(per_prompt) - 1))
        half = Z_95 * sd / math.sqrt(len(per_prompt))
        assert e.value == pytest.approx(mean, abs=1e-12) and e.prompts == 6
        assert e.low == pytest.approx(max(0.0, mean - half), abs=1e-12)
        assert e.high == pytest.approx(min(1.0, mean + half), abs=1e-12)
        assert 0.0 <= e.low <= e.value <= e.high <= 1.0
    assert [e.value for e in estimates] == sorted(e.value for e in estimates)  # rises with k


def test_intervals_and_bad_input() -> None:
    assert mean_interval([0.4]) == (0.4, 0.0, 1.0)  # one prompt: no spread to measure
    assert mean_interval([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError):
        pass_at_k([[True, False], [True]])
    with pytest.raises(ValueError):
        pass_at_k([])


def test_passes_and_verifier_means() -> None:
    assert passes([[1.0, 0.5], [0.99, 1.2]], threshold=1.0) == [[True, False], [False, True]]
    scores = [{"a": 1.0, "b": None}, {"a": 0.0, "b": 0.5}, {"a": 0.5}, {"c": None}]
    assert verifier_means(scores) == {"a": 0.5, "b": 0.5, "c": None}
