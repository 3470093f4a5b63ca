"""pass@k: the chance that at least one of k samples of a prompt passes, estimated without bias
from n >= k samples of which c passed (Chen et al. 2021, "Evaluating Large Language Models
Trained on Code", eq. 1):

    pass@k = E_prompts[ 1 - C(n - c, k) / C(n, k) ]

The ratio of binomials is computed as the product prod_{i=n-c+1..n} (1 - k / i), which neither
overflows nor loses precision for large n (the paper's numerically stable form). The reported
value is the mean over prompts; its 95% interval is the normal one for a mean over prompts,
mean +- 1.96 * s / sqrt(m) with s the sample standard deviation of the m per-prompt estimates,
clipped to [0, 1]. It covers the spread between prompts (the sampling noise of each prompt's
estimate is inside it); one prompt gives no spread, so its interval is all of [0, 1].
Pure Python: no torch, no numpy (the API may import it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


def pass_at_k_one(n: int, c: int, k: int) -> float:
    """The unbiased estimate for one prompt: n samples, c of them passed, k <= n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a passing sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(samples_per_prompt: int) -> list[int]:
    """1 and the powers of two up to samples_per_prompt: 1, 2, 4, ... <= n."""
    if samples_per_prompt < 1:
        raise ValueError("samples_per_prompt must be at least 1")
    return [2**p for p in range(samples_per_prompt.bit_length()) if 2**p <= samples_per_prompt]


@dataclass(frozen=True)
class Estimate:
    k: int
    value: float  # the mean over prompts
    low: float  # 95% interval
    high: float
    prompts: int


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the normal 95% interval of the mean, clipped to [0, 1]."""
    m = len(values)
    if m == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / m
    if m == 1:
        return mean, 0.0, 1.0
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (m - 1))
    half = Z_95 * sd / math.sqrt(m)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def pass_at_k(passed: Sequence[Sequence[bool]], ks: Sequence[int] | None = None) -> list[Estimate]:
    """Estimates for each k (default `ks_for(n)`), from each prompt's pass/fail per sample.
    Every prompt must have the same number of samples n."""
    if not passed:
        raise ValueError("no prompts")
    n = len(passed[0])
    if any(len(p) != n for p in passed):
        raise ValueError("every prompt needs the same number of samples")
    counts = [sum(bool(x) for x in p) for p in passed]
    out = []
    for k in ks if ks is not None else ks_for(n):
        mean, low, high = mean_interval([pass_at_k_one(n, c, k) for c in counts])
        out.append(Estimate(k=k, value=mean, low=low, high=high, prompts=len(counts)))
    return out


def passes(rewards: Sequence[Sequence[float]], threshold: float) -> list[list[bool]]:
    """A sample passes when its reward is at least the threshold."""
    return [[r >= threshold for r in group] for group in rewards]


def verifier_means(scores: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Each verifier's mean score over the samples it scored (None, an error, is left out;
    a verifier that scored none has None)."""
    names = sorted({name for s in scores for name in s})
    means: dict[str, float | None] = {}
    for name in names:
        values = [s[name] for s in scores if s.get(name) is not None]
        means[name] = math.fsum(values) / len(values) if values else None  # type: ignore[arg-type]
    return means
