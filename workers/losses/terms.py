"""The Tinker API's built-in losses (tinker-docs.thinkingmachines.ai/tinker/losses), per datum,
each registered once under its name in `registry.SPECS`.

Every loss is a sum over the datum's tokens (Tinker normalises nothing: weights and advantages
carry any scaling), a pure function of the learner's log-probs `lp` (T,) of `target_tokens`
under the adapter being trained, and the datum's other inputs (T,) each:

- cross_entropy:        -w_t * lp_t                                   (w = `weights`, default 1)
- importance_sampling:  -rho_t * A_t,   rho_t = exp(lp_t - q_t)  (q: `logprobs`, the sampler's;
                                                                  A: `advantages`)
- ppo:                  -min(rho_t * A_t, clip(rho_t, lo, hi) * A_t)     (`clipped_surrogate`)
- cispo:                -sg(clip(rho_t, lo, hi)) * lp_t * A_t
- dro:                  -(lp_t * A_t - beta / 2 * (lp_t - q_t)^2)
- gspo (GSPO-token):    ppo's term with rho_t = sg(s) * exp(lp_t - sg(lp_t)), s the geometric
                        mean of the ratios over the tokens `sequence_ratio_mask` marks (all
                        tokens without one): every token carries the sequence ratio's value and
                        its own log-prob's gradient

`lo` / `hi` are ratio thresholds (`loss_fn_config` clip_low_threshold / clip_high_threshold,
defaults in the registry; per-token `loss_fn_inputs` of those names win). GRPO's loss is ppo's
term with lo = 1 - eps, hi = 1 + eps_high, aggregated over a batch (workers/grpo/loss.py).
Left out: stable_reinforce; custom losses run client-side (registry.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from workers.losses.registry import SPECS

Inputs = dict[str, Tensor]  # loss_fn_inputs of one datum, each (T,)
LossFn = Callable[[Tensor, Inputs, dict[str, float]], Tensor]  # (lp, inputs, config) -> (T,)
LOSSES: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Registers the term of `name`, a loss the registry describes, once."""

    def register(fn: LossFn) -> LossFn:
        if name not in SPECS:
            raise KeyError(f"{name!r} is not in workers/losses/registry.py")
        if name in LOSSES:
            raise ValueError(f"{name!r} is registered twice")
        LOSSES[name] = fn
        return fn

    return register


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, lo: float | Tensor, hi: float | Tensor
) -> Tensor:
    """PPO's clipped objective, negated: -min(rho * A, clip(rho, lo, hi) * A), elementwise."""
    # torch's stubs overload clamp on floats or on tensors, not on the union both run with
    clipped = torch.clamp(ratio, lo, hi)  # type: ignore[arg-type]
    return -torch.min(ratio * advantages, clipped * advantages)


@register_loss("cross_entropy")
def cross_entropy(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    weights = x.get("weights", torch.ones_like(lp))  # (T,)
    return -weights * lp  # (T,)


@register_loss("importance_sampling")
def importance_sampling(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    ratio = torch.exp(lp - x["logprobs"])  # (T,)
    return -ratio * x["advantages"]  # (T,)


def _thresholds(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> tuple[Tensor, Tensor]:
    lo = x.get("clip_low_threshold", torch.full_like(lp, cfg["clip_low_threshold"]))  # (T,)
    hi = x.get("clip_high_threshold", torch.full_like(lp, cfg["clip_high_threshold"]))  # (T,)
    return lo, hi


@register_loss("ppo")
def ppo(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    ratio = torch.exp(lp - x["logprobs"])  # (T,)
    return clipped_surrogate(ratio, x["advantages"], *_thresholds(lp, x, cfg))  # (T,)


@register_loss("cispo")
def cispo(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    lo, hi = _thresholds(lp, x, cfg)
    clipped = torch.clamp(torch.exp(lp - x["logprobs"]), lo, hi).detach()  # (T,)
    return -clipped * lp * x["advantages"]  # (T,)


@register_loss("dro")
def dro(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    quadratic = (lp - x["logprobs"]) ** 2  # (T,)
    return -(lp * x["advantages"] - 0.5 * cfg["beta"] * quadratic)  # (T,)


@register_loss("gspo")
def gspo(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    mask = x.get("sequence_ratio_mask", torch.ones_like(lp)) != 0  # (T,)
    log_ratios = (lp.detach() - x["logprobs"])[mask]  # (M,)
    log_s = log_ratios.mean() if log_ratios.numel() else lp.new_zeros(())  # ()
    ratio = torch.exp(log_s + lp - lp.detach())  # (T,) the value s, the gradient of lp_t
    return clipped_surrogate(ratio, x["advantages"], *_thresholds(lp, x, cfg))  # (T,)
