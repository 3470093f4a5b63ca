"""The Tinker API's built-in losses (tinker-docs.thinkingmachines.ai/tinker/losses), per datum.

Every loss is a sum over the datum's tokens (Tinker normalises nothing: weights and advantages
carry any scaling), a pure function of the learner's log-probs `lp` (T,) of `target_tokens`
under the adapter being trained, and the datum's other inputs (T,) each:

- cross_entropy:        -w_t * lp_t                                   (w = `weights`, default 1)
- importance_sampling:  -rho_t * A_t,   rho_t = exp(lp_t - q_t)  (q: `logprobs`, the sampler's;
                                                                  A: `advantages`)
- ppo:                  -min(rho_t * A_t, clip(rho_t, lo, hi) * A_t)
- cispo:                -sg(clip(rho_t, lo, hi)) * lp_t * A_t
- dro:                  -(lp_t * A_t - beta / 2 * (lp_t - q_t)^2)
- gspo (GSPO-token):    ppo's term with rho_t = sg(s) * exp(lp_t - sg(lp_t)), s the geometric
                        mean of the ratios over the tokens `sequence_ratio_mask` marks (all
                        tokens without one): every token carries the sequence ratio's value and
                        its own log-prob's gradient

`lo` / `hi` are ratio thresholds (`loss_fn_config` clip_low_threshold / clip_high_threshold,
defaults 0.8 / 1.2, Tinker's epsilon 0.2; per-token `loss_fn_inputs` of those names win);
dro's `beta` defaults to 0.05. Left out: stable_reinforce and custom losses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

Inputs = dict[str, Tensor]  # loss_fn_inputs of one datum, each (T,)


@dataclass(frozen=True)
class Loss:
    fn: Callable[[Tensor, Inputs, dict[str, float]], Tensor]  # (lp, inputs, config) -> (T,)
    required: tuple[str, ...]  # loss_fn_inputs it needs besides target_tokens
    optional: tuple[str, ...] = ()
    config: dict[str, float] = field(default_factory=dict)  # loss_fn_config keys and defaults


def cross_entropy(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    weights = x.get("weights", torch.ones_like(lp))  # (T,)
    return -weights * lp  # (T,)


def importance_sampling(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    ratio = torch.exp(lp - x["logprobs"])  # (T,)
    return -ratio * x["advantages"]  # (T,)


def _thresholds(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> tuple[Tensor, Tensor]:
    lo = x.get("clip_low_threshold", torch.full_like(lp, cfg["clip_low_threshold"]))  # (T,)
    hi = x.get("clip_high_threshold", torch.full_like(lp, cfg["clip_high_threshold"]))  # (T,)
    return lo, hi


def ppo(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    ratio = torch.exp(lp - x["logprobs"])  # (T,)
    lo, hi = _thresholds(lp, x, cfg)
    clipped = torch.clamp(ratio, lo, hi)  # (T,)
    return -torch.min(ratio * x["advantages"], clipped * x["advantages"])  # (T,)


def cispo(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    lo, hi = _thresholds(lp, x, cfg)
    clipped = torch.clamp(torch.exp(lp - x["logprobs"]), lo, hi).detach()  # (T,)
    return -clipped * lp * x["advantages"]  # (T,)


def dro(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    quadratic = (lp - x["logprobs"]) ** 2  # (T,)
    return -(lp * x["advantages"] - 0.5 * cfg["beta"] * quadratic)  # (T,)


def gspo(lp: Tensor, x: Inputs, cfg: dict[str, float]) -> Tensor:
    mask = x.get("sequence_ratio_mask", torch.ones_like(lp)) != 0  # (T,)
    log_ratios = (lp.detach() - x["logprobs"])[mask]  # (M,)
    log_s = log_ratios.mean() if log_ratios.numel() else lp.new_zeros(())  # ()
    ratio = torch.exp(log_s + lp - lp.detach())  # (T,) the value s, the gradient of lp_t
    lo, hi = _thresholds(lp, x, cfg)
    clipped = torch.clamp(ratio, lo, hi)  # (T,)
    return -torch.min(ratio * x["advantages"], clipped * x["advantages"])  # (T,)


_POLICY = ("logprobs", "advantages")
_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
_CLIP_INPUTS = tuple(_CLIP)

LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(cross_entropy, (), ("weights",)),
    "importance_sampling": Loss(importance_sampling, _POLICY),
    "ppo": Loss(ppo, _POLICY, _CLIP_INPUTS, _CLIP),
    "cispo": Loss(cispo, _POLICY, _CLIP_INPUTS, _CLIP),
    "dro": Loss(dro, _POLICY, (), {"beta": 0.05}),
    "gspo": Loss(gspo, _POLICY, (*_CLIP_INPUTS, "sequence_ratio_mask"), _CLIP),
}

# Every loss_fn_inputs name the SDK sends (its Datum's key -> dtype table): a name outside it is
# a mistake the caller hears of; one a given loss does not use is ignored, as Tinker does.
KNOWN_INPUTS = {"target_tokens", "weights", "logprobs", "advantages", *_CLIP_INPUTS,
                "sequence_ratio_mask"}  # fmt: skip
