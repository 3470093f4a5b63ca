"""Per-token log-probabilities log pi(y_t | x, y_<t) of sampled completion tokens, and entropy.

One forward pass over prompt + completion; only the logits that predict completion tokens are
computed, divided by the sampling temperature (the policy that sampled is softmax(logits / T),
so the ratio and KL use the same distribution). Llama-family models run `lean_forward.lean_logits`
(the same numbers with fewer ops; each distinct prompt of a group runs once, also in the
training forward, where autograd sums the prompt's gradient over its completions, and each
completion only up to its end: a batch of completions of mean length 65 of 96 scored in 0.36
instead of 0.46 s, trained in 1.05 instead of 1.49 s on the 25M benchmark model);
any other model its own forward: each distinct prompt once, its KV cache copied to the rows of
its group (`reorder_cache`, differentiable: autograd sums the prompt's gradient over them),
then the completions on top of it. The log-prob of the chosen token is
gathered as logit - logsumexp, without a full log-softmax copy; the entropy (a metric only) is
computed without gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workers.grpo.lean import Tape, supported
from workers.grpo.lean_forward import lean_logits, prompt_groups
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
    logits = _own_forward_logits(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, groups
    )
    n, t = logits.shape[:2]  # (N, T, V)
    return logits.flatten(0, 1), torch.arange(n * t, device=logits.device)


def _own_forward_logits(
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
    """Log-probs (N, T) of `completion_ids` and, if asked, the per-token entropy (N, T); both
    0 where `completion_mask` is 0. `lengths` (the mask's row sums) and `groups` (each row's
    group: `sampling.Generation`) on the host, if known, spare reads from the device."""
    logits, where = completion_logits(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, tape, lengths, groups
    )  # (R, V), (R,)
    logits = logits.float()  # no copy when already fp32
    if temperature != 1.0:
        logits = logits / temperature  # (R, V)
    lse = torch.logsumexp(logits, dim=-1)  # (R,)
    tokens = completion_ids.flatten()[where]  # (R,)
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (R,)
    unscored = completion_mask == 0  # (N, T)

    def placed(values: Tensor) -> Tensor:  # (R,) -> (N, T), 0 where unscored
        flat = values.new_zeros(completion_ids.numel()).index_copy(0, where, values)
        return flat.view(completion_ids.shape).masked_fill(unscored, 0.0)

    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = (logits - lse.unsqueeze(-1)).exp()  # (R, V)
            entropy = placed(lse - (probs * logits).sum(-1))  # (N, T)
    return placed(chosen - lse), entropy
