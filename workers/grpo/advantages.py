"""Group-relative advantages of GRPO (Shao et al., 2024, DeepSeekMath, eq. 3 / outcome supervision).

For each group of G completions of one prompt with rewards r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + eps)

`std="population"` divides by the population std (the seed's worked example), `"sample"` by the
Bessel-corrected std (as TRL), `"none"` does not divide (Dr. GRPO, Liu et al., 2025). Every token
of completion i later receives A_i. Process supervision (per-step rewards) is left out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_SCALES: dict[str, Callable[[Tensor, float], Tensor]] = {
    "population": lambda g, eps: g.std(dim=1, unbiased=False, keepdim=True) + eps,
    "sample": lambda g, eps: g.std(dim=1, unbiased=True, keepdim=True) + eps,
    "none": lambda g, eps: torch.ones_like(g[:, :1]),
}


def group_advantages(
    rewards: Tensor, group_size: int, std: str = "population", eps: float = 1e-4
) -> Tensor:
    """Advantages (N,) for rewards (N,) laid out group by group (G consecutive completions)."""
    groups = rewards.float().view(-1, group_size)  # (P, G)
    centred = groups - groups.mean(dim=1, keepdim=True)  # (P, G)
    return (centred / _SCALES[std](groups, eps)).view(-1)  # (N,)


def zero_std_group_fraction(rewards: Tensor, group_size: int) -> float:
    """Share of groups whose rewards are all equal: they carry no learning signal."""
    groups = rewards.view(-1, group_size)  # (P, G)
    return (groups == groups[:, :1]).all(dim=1).float().mean().item()
