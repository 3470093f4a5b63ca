"""GRPO steps 5-6 in micro-batches: log-probs under pi_ref / pi_old, and the policy gradient.

`batch_logprobs` scores the sampled completions under a frozen policy (pi_ref, or pi_old when
the batch is reused mu = num_iterations times), micro-batch by micro-batch, in inference mode.
`accumulate_gradients` backpropagates the clipped-surrogate + k3-KL loss (`loss.grpo_loss`,
Shao et al., 2024, eq. 3) micro-batch by micro-batch; every micro-batch divides by the full
batch's denominator, so the summed gradient equals the one-batch gradient exactly. Each
micro-batch runs only up to its longest completion (`micro_batches`); with
`micro_batch_tokens` the micro-batches are packed instead, sequences end to end without padding
(`packing.py`). The forwards are the backend's (`backend.py`); None chooses one for the model.

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
from workers.grpo.packing import Pack, pack_micro_batches
from workers.grpo.sampling import Generation

Context = Callable[[], contextlib.AbstractContextManager]
Window = tuple[slice, slice] | Pack  # (rows, completion columns) of a padded micro-batch, or a pack


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


def windows(out: Generation, size: int | None, tokens: int | None) -> list[Window]:
    """The micro-batches of a batch: packed ones of at most `tokens` tokens when set, else
    `size` rows each."""
    if tokens is None:
        return list(micro_batches(out, size))
    return list(pack_micro_batches(out, tokens))


def _span(window: Window) -> tuple[slice | Tensor, slice]:
    """The window's rows and completion columns in the batch's (N, T) tensors."""
    return (window.rows, window.cols) if isinstance(window, Pack) else window


def padding_fraction(out: Generation, batches: list[Window]) -> Tensor:
    """Share (0-d) of padded positions among all positions of the forwards' inputs: a padded
    micro-batch feeds its rows' prompts (the batch's prompt width) and completions up to its
    columns; a pack feeds its tokens and nothing else."""
    positions = real = torch.zeros((), device=out.completion_ids.device)
    for window in batches:
        if isinstance(window, Pack):
            positions, real = positions + window.tokens, real + window.tokens
            continue
        rows, cols = window
        prompt = out.prompt_mask[rows]  # (n, P)
        completion = out.completion_mask[rows, cols]  # (n, t)
        positions = positions + prompt.numel() + completion.numel()
        real = real + prompt.sum() + completion.sum()
    return 1 - real / positions.clamp(min=1)


def batch_logprobs(
    model: Any,
    out: Generation,
    temperature: float,
    micro_batch_size: int | None,
    context: Context = contextlib.nullcontext,
    backend: Backend | None = None,
    micro_batch_tokens: int | None = None,
) -> Tensor:
    """Log-probs (N, T) of the completions under `model` (pi_ref or pi_old), by micro-batch
    (packed ones of at most `micro_batch_tokens` tokens when set); 0 past each micro-batch's
    longest completion."""
    backend = backend or select_backend(model)
    with torch.inference_mode(), context():
        logprobs = torch.zeros(out.completion_ids.shape, device=out.completion_ids.device)
        for window in windows(out, micro_batch_size, micro_batch_tokens):
            if isinstance(window, Pack):
                lp = backend.packed_forward(model, out, window, temperature, False)[0]  # (n, t)
            else:
                lp = backend.logprobs(model, out, *window, temperature)  # (n, t)
            rows, cols = _span(window)
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
    sampler_lp: Tensor | None = None,
) -> dict[str, Any]:
    """Backward the loss micro-batch by micro-batch; returns token-weighted batch statistics.
    `sampler_lp` (N, T): an off-policy batch's sampler log-probs, for the TIS weights.

    `loss_mask` (N, T) selects the tokens that carry loss (the completion mask, less truncated
    completions when `mask_truncated_completions`; an episode's model tokens only); the forward
    pass attends to every completion token through `out.completion_mask`.
    """
    backend = backend or select_backend(model)
    total_tokens = loss_mask.sum().clamp(min=1)  # ()
    stats: dict[str, Any] = {}
    entropy_sum = torch.zeros((), device=loss_mask.device)  # ()
    batches = windows(out, grpo.micro_batch_size, grpo.micro_batch_tokens)
    for window in batches:
        s, cols = _span(window)
        with autocast():
            if isinstance(window, Pack):
                lp, entropy = backend.packed_forward(
                    model, out, window, gen.temperature, with_entropy
                )  # (n, t)
            else:
                lp, entropy = backend.forward(
                    model, out, *window, gen.temperature, with_entropy
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
            sampler_logprobs=None if sampler_lp is None else sampler_lp[s, cols],
            importance_cap=grpo.importance_sampling_cap,
        )
        loss.backward()
        share = loss_mask[s, cols].sum() / total_tokens  # () token-weighted over micro-batches
        for k, v in mb.items():
            stats[k] = stats.get(k, 0.0) + (v if k in ("loss", "policy_loss") else v * share)
        if entropy is not None:
            entropy_sum += (entropy.float() * out.sampled_mask[s, cols]).sum()  # ()
    if with_entropy:
        stats["entropy"] = entropy_sum / out.sampled_mask.sum().clamp(min=1)  # ()
    stats["padding_fraction"] = padding_fraction(out, batches)  # ()
    return stats
