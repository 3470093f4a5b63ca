"""Packed micro-batches: a step's sequences laid end to end, without padding, at most T tokens each.

veRL's `use_remove_padding` with its dynamic batch size (`ppo_max_token_len_per_gpu`), in the
model's own forward: each sequence (its prompt's tokens, then its completion up to its end)
follows the previous one in a single row of a micro-batch, its position ids restarting at 0.
Given `position_ids` and no attention mask, transformers (`masking_utils`) finds where the
positions restart and keeps attention within each sequence: a block-diagonal causal mask for
SDPA and eager attention, variable-length kernels (`cu_seqlens`) for flash attention. Attention,
positions and therefore every logit are those of the padded forward; only the padding's work
is gone.

Sequences go to micro-batches first-fit decreasing by length (a micro-batch takes the longest
sequence left that fits its budget), which keeps the number of forwards near total tokens / T;
a sequence longer than T (an episode's turns together) forms a micro-batch of its own. Which
rows share a micro-batch changes no number: the loss of each row is its own, and every
micro-batch divides by the whole batch's denominator (`loss.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from workers.grpo.logprobs import token_logprobs
from workers.grpo.sampling import Generation


@dataclass(frozen=True)
class Pack:
    """One packed micro-batch: the batch `rows` it holds (ascending) and the completion
    columns of its result, up to its longest completion."""

    rows: Tensor  # (n,) long, on the batch's device
    cols: slice
    tokens: int  # prompt + completion tokens laid end to end


def first_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of `lengths` in bins of total length <= `budget` (an item over it alone): each
    item, longest first, into the first bin with room."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fit = next((b for b, free in enumerate(room) if lengths[i] <= free), None)
        if fit is None:
            bins.append([])
            room.append(budget)
            fit = len(bins) - 1
        bins[fit].append(i)
        room[fit] -= lengths[i]
    return [sorted(b) for b in bins]


def pack_micro_batches(out: Generation, budget: int) -> list[Pack]:
    """The batch's rows in packed micro-batches of at most `budget` tokens (one host read of
    the prompt lengths; completion lengths from the sampler when it kept them)."""
    prompts = [int(n) for n in out.prompt_mask.sum(1).tolist()]
    completions = out.lengths or [int(n) for n in out.completion_mask.sum(1).tolist()]
    lengths = [p + c for p, c in zip(prompts, completions, strict=True)]
    device = out.completion_ids.device
    return [
        Pack(
            rows=torch.tensor(rows, device=device),
            cols=slice(0, max(1, *(completions[i] for i in rows))),
            tokens=sum(lengths[i] for i in rows),
        )
        for rows in first_fit_decreasing(lengths, budget)
    ]


def packed_inputs(out: Generation, pack: Pack) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Input ids (1, L) and position ids (1, L) of the pack's sequences end to end; the
    positions (R,) whose logits predict the completion tokens, and where those tokens sit (n, t)
    in the pack's completion columns (a bool mask, row-major in the same order)."""
    prompt_mask = out.prompt_mask[pack.rows].bool()  # (n, P)
    completion_mask = out.completion_mask[pack.rows, pack.cols].bool()  # (n, t)
    mask = torch.cat([prompt_mask, completion_mask], 1)  # (n, P + t)
    ids = torch.cat([out.prompt_ids[pack.rows], out.completion_ids[pack.rows, pack.cols]], 1)
    positions = mask.long().cumsum(1) - 1  # (n, P + t) each sequence from 0, as padded rows
    place = mask.flatten().long().cumsum(0).view(mask.shape) - 1  # (n, P + t) index in the row
    # A completion token is predicted by the logits of the token before it in its sequence:
    # its prompt's last one for token 0 (every prompt has a token: BOS at least).
    predictors = place[:, prompt_mask.shape[1] :][completion_mask] - 1  # (R,)
    return ids[mask].unsqueeze(0), positions[mask].unsqueeze(0), predictors, completion_mask


def packed_logprobs(
    model: Any, out: Generation, pack: Pack, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (n, t) of the pack's completion tokens through one unpadded forward of
    `model`, and with `with_entropy` their entropy (n, t); 0 past each completion's end.
    Only the logits that predict completion tokens are computed (`logits_to_keep`)."""
    ids, positions, predictors, scored = packed_inputs(out, pack)
    # No attention mask and no cache: transformers then reads the sequences' bounds from the
    # restarting positions (a cache would turn that off).
    logits = model(
        input_ids=ids, position_ids=positions, logits_to_keep=predictors, use_cache=False
    ).logits[0]  # (R, V)
    tokens = out.completion_ids[pack.rows, pack.cols][scored]  # (R,)
    lp, entropy = token_logprobs(logits, tokens, temperature, with_entropy)  # (R,)

    def placed(values: Tensor) -> Tensor:  # (R,) -> (n, t), 0 where nothing was scored
        return torch.zeros(scored.shape, dtype=values.dtype, device=values.device).masked_scatter(
            scored, values
        )

    return placed(lp), None if entropy is None else placed(entropy)
