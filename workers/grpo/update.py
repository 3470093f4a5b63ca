"""GRPO steps 5-6 in micro-batches: log-probs under pi_ref / pi_old, and the policy gradient.

`batch_logprobs` scores the sampled completions under a frozen policy (pi_ref, or pi_old when
the batch is reused mu = num_iterations times), micro-batch by micro-batch, in inference mode.
`accumulate_gradients` backpropagates the clipped-surrogate + k3-KL loss (`loss.grpo_loss`,
Shao et al., 2024, eq. 3) micro-batch by micro-batch; every micro-batch divides by the full
batch's denominator, so the summed gradient equals the one-batch gradient exactly.

Host round-trips: statistics stay device tensors (as `grpo_loss` returns them) and are turned into
Python floats once, by the caller, at the end of the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from workers.grpo.config import GenerationParams, GRPOParams
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.loss import grpo_loss
from workers.grpo.sampling import Generation

Context = Callable[[], contextlib.AbstractContextManager]


def micro_batches(n: int, size: int | None) -> list[slice]:
    """Slices of `size` rows (all n rows when size is None)."""
    size = size or n
    return [slice(i, i + size) for i in range(0, n, size)]


def batch_logprobs(
    model: Any,
    out: Generation,
    temperature: float,
    micro_batch_size: int | None,
    context: Context = contextlib.nullcontext,
) -> Tensor:
    """Log-probs (N, T) of the completions under `model` (pi_ref or pi_old), by micro-batch."""
    chunks = []
    with torch.inference_mode(), context():
        for s in micro_batches(out.completion_ids.shape[0], micro_batch_size):
            lp, _ = completion_logprobs(
                model,
                out.prompt_ids[s],
                out.prompt_mask[s],
                out.completion_ids[s],
                out.completion_mask[s],
                temperature,
            )
            chunks.append(lp.float())  # (n, T)
        logprobs = torch.cat(chunks)  # (N, T)
    return logprobs.clone()  # a normal tensor: inference-mode ones cannot join autograd


def accumulate_gradients(
    model: Any,
    out: Generation,
    loss_mask: Tensor,
    advantages: Tensor,
    old_lp: Tensor | None,
    ref_lp: Tensor | None,
    grpo: GRPOParams,
    gen: GenerationParams,
    denominator: float | Tensor,
    with_entropy: bool,
    autocast: Context = contextlib.nullcontext,
) -> dict[str, Any]:
    """Backward the loss micro-batch by micro-batch; returns token-weighted batch statistics.

    `loss_mask` (N, T) selects the tokens that carry loss (the completion mask, less truncated
    completions when `mask_truncated_completions`); the forward pass attends to every completion
    token through `out.completion_mask`.
    """
    total_tokens = loss_mask.sum().clamp(min=1)  # ()
    stats: dict[str, Any] = {}
    entropy_sum = torch.zeros((), device=loss_mask.device)  # ()
    for s in micro_batches(loss_mask.shape[0], grpo.micro_batch_size):
        with autocast():
            lp, entropy = completion_logprobs(
                model,
                out.prompt_ids[s],
                out.prompt_mask[s],
                out.completion_ids[s],
                out.completion_mask[s],
                gen.temperature,
                with_entropy,
            )  # (n, T)
        loss, mb = grpo_loss(
            lp.float(),
            None if old_lp is None else old_lp[s],
            None if ref_lp is None else ref_lp[s],
            advantages[s],
            loss_mask[s],
            clip_epsilon=grpo.clip_epsilon,
            clip_epsilon_high=grpo.clip_high,
            beta=grpo.beta,
            aggregation=grpo.loss_aggregation,
            max_new_tokens=gen.max_new_tokens,
            denominator=denominator,
        )
        loss.backward()
        share = loss_mask[s].sum() / total_tokens  # () token-weighted means over micro-batches
        for k, v in mb.items():
            stats[k] = stats.get(k, 0.0) + (v if k in ("loss", "policy_loss") else v * share)
        if entropy is not None:
            entropy_sum += (entropy.float() * out.completion_mask[s]).sum()  # ()
    if with_entropy:
        stats["entropy"] = entropy_sum / out.completion_mask.sum().clamp(min=1)  # ()
    return stats
