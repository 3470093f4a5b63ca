"""Per-token log-probabilities log pi(y_t | x, y_<t) of sampled completion tokens, and entropy.

The reference forward: one pass of the model's own forward over prompt + completion; only the
logits that predict completion tokens are computed (`logits_to_keep`), divided by the sampling
temperature (the policy that sampled is softmax(logits / T), so the ratio and KL use the same
distribution). The log-prob of the chosen token is gathered as logit - logsumexp, without a full
log-softmax copy; the entropy (a metric only) is computed without gradient.
`fast.logprobs` computes the same numbers with less work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def token_logprobs(
    logits: Tensor, tokens: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (R,) of `tokens` (R,) under softmax(logits / T) of logits (R, V), and with
    `with_entropy` the entropy (R,) of that distribution (no gradient)."""
    logits = logits.float()  # no copy when already fp32
    if temperature != 1.0:
        logits = logits / temperature  # (R, V)
    lse = torch.logsumexp(logits, dim=-1)  # (R,)
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (R,)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = (logits - lse.unsqueeze(-1)).exp()  # (R, V)
            entropy = lse - (probs * logits).sum(-1)  # (R,)
    return chosen - lse, entropy


def completion_logprobs(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (N, T) of `completion_ids` and, if asked, the per-token entropy (N, T); both
    0 where `completion_mask` is 0."""
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], 1)  # (N, P + T)
    ids = torch.cat([prompt_ids, completion_ids], 1)  # (N, P + T)
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # (N, P + T) left padding: real tokens from 0
    keep = completion_ids.shape[1] + 1  # the last prompt position predicts completion token 0
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep)
    logits = out.logits[:, :-1]  # (N, T, V) position j predicts completion token j
    lp, entropy = token_logprobs(
        logits.flatten(0, 1), completion_ids.flatten(), temperature, with_entropy
    )  # fmt: skip  (N T,)
    unscored = completion_mask == 0  # (N, T)
    lp = lp.view(completion_ids.shape).masked_fill(unscored, 0.0)  # (N, T)
    if entropy is not None:
        entropy = entropy.view(completion_ids.shape).masked_fill(unscored, 0.0)  # (N, T)
    return lp, entropy
