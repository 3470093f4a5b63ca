"""Per-token log-probabilities log pi(y_t | x, y_<t) of sampled completion tokens, and entropy.

One forward pass over prompt + completion; only the logits that predict completion tokens are
computed, divided by the sampling temperature (the policy that sampled is softmax(logits / T),
so the ratio and KL use the same distribution). Llama-family models run `lean_forward.lean_logits`
(the same numbers with fewer ops; each distinct prompt of a group runs once, also in the
training forward, where autograd sums the prompt's gradient over its completions);
any other model its own forward with `logits_to_keep`. The log-prob of the chosen token is
gathered as logit - logsumexp, without a full log-softmax copy; the entropy (a metric only) is
computed without gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workers.grpo.lean import Tape, supported
from workers.grpo.lean_forward import lean_logits


def completion_logits(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    tape: Tape | None = None,
) -> Tensor:
    """Logits (N, T, V) that predict each completion token; `tape`: see `lean_forward.lean_logits`
    (a model the lean forward does not cover never gets one)."""
    width = prompt_ids.shape[1] + completion_ids.shape[1]
    if supported(model, width):
        return lean_logits(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, True, tape
        )
    ids = torch.cat([prompt_ids, completion_ids], 1)  # (N, P + T)
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], 1)  # (N, P + T)
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
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (N, T) of `completion_ids` and, if asked, the per-token entropy (N, T)."""
    logits = completion_logits(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, tape
    )
    logits = logits.float()  # (N, T, V), no copy when already fp32
    if temperature != 1.0:
        logits = logits / temperature  # (N, T, V)
    lse = torch.logsumexp(logits, dim=-1)  # (N, T)
    chosen = logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (N, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = (logits - lse.unsqueeze(-1)).exp()  # (N, T, V)
            entropy = lse - (probs * logits).sum(-1)  # (N, T)
    return chosen - lse, entropy
