"""The fast log-prob forward: the numbers of `logprobs.completion_logprobs` with less work.

Llama-family models run `lean_forward.lean_logits`: the same maths with fewer ops; each
distinct prompt of a group runs once, also in the training forward, where autograd sums the
prompt's gradient over its completions, and each completion only up to its end. A `tape`
(`replay.Replay`) may supply its linear maps' outputs. Any other model runs its own forward:
each distinct prompt once, its KV cache copied to the rows of its group (`reorder_cache`,
differentiable: autograd sums the prompt's gradient over them), then the completions on top of
it. Completion lengths and prompt groups known on the host spare reads from the device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workers.grpo.fast.lean import Tape, supported
from workers.grpo.fast.lean_forward import lean_logits, prompt_groups
from workers.grpo.logprobs import token_logprobs
from workers.grpo.sampling import cache_keyword


def completion_logits(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    tape: Tape | None = None,
    lengths: list[int] | None = None,
    groups: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Logits (R, V) that predict completion tokens and their flat positions (R,) in the
    (N, T) completion: the lean forward's rows (`lean_forward.lean_logits`; `tape` and the
    host-side `lengths` and `groups` as there), or all N T rows of the model's own forward (a
    model the lean forward does not cover never gets a tape)."""
    width = prompt_ids.shape[1] + completion_ids.shape[1]
    if supported(model, width):
        return lean_logits(
            model,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            tape=tape,
            lengths=lengths,
            groups=groups,
        )
    logits = own_forward_logits(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, groups
    )
    n, t = logits.shape[:2]  # (N, T, V)
    return logits.flatten(0, 1), torch.arange(n * t, device=logits.device)


def own_forward_logits(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    groups: list[int] | None,
) -> Tensor:
    """Logits (N, T, V) predicting each completion token, through the model's own forward;
    `groups` as `lean_forward.lean_logits` takes them (None: equal prompts found on the device)."""
    p = prompt_ids.shape[1]
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], 1)  # (N, P + T)
    rows = torch.cat([prompt_ids, prompt_mask], 1)  # (N, 2P)
    unique, group, _ = prompt_groups(rows, groups, share=True)  # (U, 2P), (N,)
    if unique.shape[0] < rows.shape[0]:
        u_ids, u_mask = unique[:, :p], unique[:, p:]  # (U, P)
        u_pos = (u_mask.cumsum(1) - 1).clamp(min=0)  # (U, P)
        kw = cache_keyword(model)
        first = model(input_ids=u_ids, attention_mask=u_mask, position_ids=u_pos, use_cache=True,
                      logits_to_keep=1)  # fmt: skip
        cache = first[kw]
        if hasattr(cache, "reorder_cache"):  # transformers' Cache classes
            cache.reorder_cache(group)  # (N, ...) each row its prompt's keys and values
            t = completion_ids.shape[1]
            c_pos = u_mask.sum(1)[group].unsqueeze(1) + torch.arange(t, device=mask.device)
            rest = model(input_ids=completion_ids, attention_mask=mask, position_ids=c_pos,
                         use_cache=True, **{kw: cache})  # fmt: skip
            return torch.cat([first.logits[group, -1:], rest.logits[:, :-1]], 1)  # (N, T, V)
    ids = torch.cat([prompt_ids, completion_ids], 1)  # (N, P + T)
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # (N, P + T)
    keep = completion_ids.shape[1] + 1
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep)
    return out.logits[:, :-1]  # (N, T, V)


def completion_logprobs(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    tape: Tape | None = None,
    lengths: list[int] | None = None,
    groups: list[int] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`logprobs.completion_logprobs`, through the fast forwards. `lengths` (the mask's row
    sums) and `groups` (each row's group) on the host, if known, spare reads from the device."""
    logits, where = completion_logits(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, tape, lengths, groups
    )  # (R, V), (R,)
    tokens = completion_ids.flatten()[where]  # (R,)
    lp, entropy = token_logprobs(logits, tokens, temperature, with_entropy)  # (R,)
    unscored = completion_mask == 0  # (N, T)

    def placed(values: Tensor) -> Tensor:  # (R,) -> (N, T), 0 where unscored
        flat = values.new_zeros(completion_ids.numel()).index_copy(0, where, values)
        return flat.view(completion_ids.shape).masked_fill(unscored, 0.0)

    return placed(lp), None if entropy is None else placed(entropy)
