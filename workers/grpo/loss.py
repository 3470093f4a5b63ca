"""The GRPO clipped surrogate with a k3 KL penalty (Shao et al., 2024, eq. 3; DAPO; Dr. GRPO).

Per completion token t of completion i, with ratio rho = exp(log pi_theta - log pi_old):

    l_it = -min(rho * A_i, clip(rho, 1 - eps, 1 + eps_high) * A_i)
           + beta * (exp(ref - log pi_theta) - (ref - log pi_theta) - 1)

The first term is the registered `ppo` loss's (`workers.losses.terms.clipped_surrogate`, the
one the Tinker API's ppo and gspo run) with thresholds 1 - eps and 1 + eps_high; what GRPO adds
is the sequence's advantage on every token, the aggregation, the KL penalty and TIS.

summed over the tokens up to and including EOS (`mask`), then divided by a denominator picked by
the aggregation (a small function chosen once):

- `sequence_mean` (GRPO as published): mean over sequences of (sum_t l_it) / |y_i|
- `token_mean` (DAPO / BNPO): sum_it l_it / sum_i |y_i|
- `constant` (Dr. GRPO): sum_it l_it / (N * max_new_tokens)

Gradient accumulation: every aggregation is "a sum over completions divided by a batch
constant". `loss_denominator` computes that constant over the *full* batch; pass it as
`denominator` to each micro-batch's `grpo_loss` and the micro-batch losses (and gradients) add
up exactly to the full-batch ones. Across processes the same holds: `total` adds a count up over
every process's share of the batch (`distributed.Ranks.total`), and the summed gradients equal
the one-process ones.

Off-policy rollouts (`grpo.max_off_policy_steps` K >= 1, `off_policy.py`) were sampled by a
policy up to K updates older than pi_old. Truncated importance sampling (TIS: Yao et al., 2025,
"Your efficient RL framework secretly brings you off-policy RL training", as veRL and prime-rl
apply it) multiplies each token's policy-gradient term by

    w_it = min(pi_old(y_it) / pi_sampler(y_it), cap)        (no gradient through w)

Left out: entropy bonus; the sequence-level and masked (MIS) variants of the correction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from workers.losses.terms import clipped_surrogate

Total = Callable[[Any], Any]  # a count of this process's rows -> that count over the whole batch
# Each aggregation: (per-token values (N, T), mask (N, T)) -> sum that the denominator divides.
_NUMERATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "sequence_mean": lambda v, m: ((v * m).sum(1) / m.sum(1).clamp(min=1)).sum(),
    "token_mean": lambda v, m: (v * m).sum(),
    "constant": lambda v, m: (v * m).sum(),
}
_DENOMINATORS: dict[str, Callable[[Tensor, int, Total], float | Tensor]] = {
    "sequence_mean": lambda m, max_new, total: float(total(m.shape[0])),
    "token_mean": lambda m, max_new, total: total(m.sum()).clamp(min=1.0),  # on the device
    "constant": lambda m, max_new, total: float(total(m.shape[0]) * max_new),
}


def _same(count: Any) -> Any:
    return count


def loss_denominator(
    mask: Tensor, aggregation: str, max_new_tokens: int, total: Total = _same
) -> float | Tensor:
    """The batch constant the aggregation divides by; compute it over the full batch (`total`:
    the whole batch's count from this process's, when the batch is split across processes)."""
    return _DENOMINATORS[aggregation](mask, max_new_tokens, total)


def importance_weights(
    old_logprobs: Tensor, sampler_logprobs: Tensor, cap: float
) -> tuple[Tensor, Tensor]:
    """TIS weights min(pi_old / pi_sampler, cap) (N, T), detached, and where the cap bit (N, T)."""
    ratio = torch.exp(old_logprobs.detach() - sampler_logprobs)  # (N, T)
    return ratio.clamp(max=cap), ratio > cap  # (N, T), (N, T)


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_epsilon: float,
    clip_epsilon_high: float,
    beta: float,
    aggregation: str,
    max_new_tokens: int,
    denominator: float | Tensor | None = None,
    sampler_logprobs: Tensor | None = None,
    importance_cap: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss (scalar) and stats; `denominator=None` means this batch is the whole batch.
    With `sampler_logprobs` (N, T) and an `importance_cap`, the policy term is TIS-weighted.

    The stats are detached 0-d tensors on the loss's device: reading one (`float`, `.item()`)
    waits for the device, so the trainer reads them once, at the end of the step.
    """
    numerator = _NUMERATORS[aggregation]
    if denominator is None:
        denominator = loss_denominator(mask, aggregation, max_new_tokens)
    old = logprobs.detach() if old_logprobs is None else old_logprobs  # (N, T)
    ratio = torch.exp(logprobs - old)  # (N, T)
    adv = advantages.unsqueeze(1)  # (N, 1)
    policy = clipped_surrogate(ratio, adv, 1 - clip_epsilon, 1 + clip_epsilon_high)  # (N, T)
    tis = sampler_logprobs is not None and importance_cap is not None
    if sampler_logprobs is not None and importance_cap is not None:
        weight, capped = importance_weights(old, sampler_logprobs, importance_cap)  # (N, T)
        policy = policy * weight  # (N, T)
    if ref_logprobs is not None:
        delta = ref_logprobs - logprobs  # (N, T)
        kl = torch.exp(delta) - delta - 1  # (N, T)
    else:
        kl = torch.zeros_like(logprobs)  # (N, T)
    policy_loss = numerator(policy, mask) / denominator
    loss = policy_loss + beta * numerator(kl, mask) / denominator
    n_tokens = mask.sum().clamp(min=1)
    low = ((ratio < 1 - clip_epsilon) & (adv < 0)).float()  # (N, T)
    high = ((ratio > 1 + clip_epsilon_high) & (adv > 0)).float()  # (N, T)
    stats = {
        "loss": loss.detach(),
        "policy_loss": policy_loss.detach(),
        "kl": (kl.detach() * mask).sum() / n_tokens,
        "clip_ratio_low": (low * mask).sum() / n_tokens,
        "clip_ratio_high": (high * mask).sum() / n_tokens,
        "clip_ratio": ((low + high) * mask).sum() / n_tokens,
    }
    if tis:
        stats["is_weight_mean"] = (weight * mask).sum() / n_tokens
        stats["is_clipped_frac"] = (capped.float() * mask).sum() / n_tokens
    return loss, stats
