"""GRPO steps 5-6 in micro-batches: log-probs under pi_ref / pi_old, and the policy gradient.

`batch_logprobs` scores the sampled completions under a frozen policy (pi_ref, or pi_old when
the batch is reused mu = num_iterations times), micro-batch by micro-batch, in inference mode.
`accumulate_gradients` backpropagates the clipped-surrogate + k3-KL loss (`loss.grpo_loss`,
Shao et al., 2024, eq. 3) micro-batch by micro-batch; every micro-batch divides by the full
batch's denominator, so the summed gradient equals the one-batch gradient exactly. Each
micro-batch runs only up to its longest completion (`micro_batches`). The forwards are the
backend's (`backend.py`); None chooses one for the model.

Host round-trips: statistics stay device tensors (as `grpo_loss` returns them) and are turned into
Python floats once, by the caller, at the end of the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from workers.grpo.backend import Backend, select_backend
from workers.grpo.config import GenerationParams, GRPOParams
from workers.grpo.loss import grpo_loss
from workers.grpo.sampling import Generation

Context = Callable[[], contextlib.AbstractContextManager]


def micro_batches(out: Generation, size: int | None) -> list[tuple[slice, slice]]:
    """(rows, completion columns) of each micro-batch of `size` rows (all rows when None).

    The columns end at the longest completion among the micro-batch's rows: a micro-batch of
    short completions does not pay for the batch's longest one. The cut columns hold no
    completion token, so every sum over the mask, hence the loss and its gradient, is unchanged.
    """
    n, width = out.completion_ids.shape
    size = size or n
    windows = []
    for start in range(0, n, size):
        rows = slice(start, start + size)
        longest = width if out.lengths is None else max(1, *out.lengths[rows])
        windows.append((rows, slice(0, longest)))
    return windows


def batch_logprobs(
    model: Any,
    out: Generation,
    temperature: float,
    micro_batch_size: int | None,
    context: Context = contextlib.nullcontext,
    backend: Backend | None = None,
) -> Tensor:
    """Log-probs (N, T) of the completions under `model` (pi_ref or pi_old), by micro-batch;
    0 past each micro-batch's longest completion."""
    backend = backend or select_backend(model)
    with torch.inference_mode(), context():
        logprobs = torch.zeros(out.completion_ids.shape, device=out.completion_ids.device)
        for rows, cols in micro_batches(out, micro_batch_size):
            lp = backend.logprobs(model, out, rows, cols, temperature)  # (n, t)
            logprobs[rows, cols] = lp.float()  # (n, t)
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
    backend: Backend | None = None,
) -> dict[str, Any]:
    """Backward the loss micro-batch by micro-batch; returns token-weighted batch statistics.

    `loss_mask` (N, T) selects the tokens that carry loss (the completion mask, less truncated
    completions when `mask_truncated_completions`; an episode's model tokens only); the forward
    pass attends to every completion token through `out.completion_mask`.
    """
    backend = backend or select_backend(model)
    total_tokens = loss_mask.sum().clamp(min=1)  # ()
    stats: dict[str, Any] = {}
    entropy_sum = torch.zeros((), device=loss_mask.device)  # ()
    for s, cols in micro_batches(out, grpo.micro_batch_size):
        with autocast():
            lp, entropy = backend.forward(
                model, out, s, cols, gen.temperature, with_entropy
            )  # (n, t)
        loss, mb = grpo_loss(
            lp.float(),
            None if old_lp is None else old_lp[s, cols],
            None if ref_lp is None else ref_lp[s, cols],
            advantages[s],
            loss_mask[s, cols],
            clip_epsilon=grpo.clip_epsilon,
            clip_epsilon_high=grpo.clip_high,
            beta=grpo.beta,
            aggregation=grpo.loss_aggregation,
            max_new_tokens=gen.max_new_tokens,
            denominator=denominator,
        )
        loss.backward()
        share = loss_mask[s, cols].sum() / total_tokens  # () token-weighted over micro-batches
        for k, v in mb.items():
            stats[k] = stats.get(k, 0.0) + (v if k in ("loss", "policy_loss") else v * share)
        if entropy is not None:
            entropy_sum += (entropy.float() * out.sampled_mask[s, cols]).sum()  # ()
    if with_entropy:
        stats["entropy"] = entropy_sum / out.sampled_mask.sum().clamp(min=1)  # ()
    return stats
