"""`num_samples` sequences from one prompt, with the sampler's per-token log-probs.

All rows share the prompt, so they need no padding: the prompt is prefilled once per row and
decoded one token at a time with the model's KV cache. Each draw reuses the GRPO engine's
(`workers.grpo.sampling`): logits / T, top-k, top-p, then the inverse CDF at the row's own
uniform; a row's uniforms come from `seed` and the row's index alone (`RowSeeds`), so a seed
gives the same sequences whatever else the host does. The log-prob kept for a token is
log softmax(logits / T) before top-k / top-p (the policy's distribution, what a teacher-forced
forward at the same temperature computes); temperature 0 is greedy, its log-probs at T = 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from workers.grpo.logprobs import token_logprobs
from workers.grpo.sampling import RowSeeds, cache_keyword, row_noise, sample_next
from workers.tinker.types import SampledSequence


@dataclass(frozen=True)
class Draw:
    """What `sample_next` reads (the engine's GenerationParams' sampling fields)."""

    temperature: float
    top_k: int
    top_p: float


@dataclass(frozen=True)
class StopRule:
    token_ids: frozenset[int]
    strings: tuple[str, ...]


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") % 2**62


def _ends(row: list[int], rule: StopRule, tokenizer: Any) -> bool:
    if row[-1] in rule.token_ids:
        return True
    return bool(rule.strings) and any(s in tokenizer.decode(row) for s in rule.strings)


@torch.no_grad()
def sample_sequences(
    model: Any,
    tokenizer: Any,
    prompt: list[int],
    num_samples: int,
    draw: Draw,
    steps: int,
    rule: StopRule,
    seed: int,
) -> list[SampledSequence]:
    device, kw = model.device, cache_keyword(model)
    greedy = draw.temperature == 0
    params = Draw(1.0, draw.top_k, draw.top_p) if greedy else draw
    noise = row_noise(
        torch.Generator(), 0, num_samples, steps, device, RowSeeds(seed, list(range(num_samples)))
    )  # fmt: skip  (N, steps)
    ids = torch.tensor([prompt] * num_samples, device=device)  # (N, P)
    rows: list[list[int]] = [[] for _ in range(num_samples)]
    kept: list[list[float]] = [[] for _ in range(num_samples)]
    ended = [False] * num_samples
    cache = None
    for t in range(steps):
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
        cache, logits = out[kw], out.logits[:, -1]  # (N, V)
        token, logprob = sample_next(logits, params, noise[:, t], keep=True)  # (N,), (N,)
        if greedy:
            token = logits.argmax(-1)  # (N,)
            logprob = token_logprobs(logits, token, 1.0, False)[0]  # (N,)
        for i, (tok, lp) in enumerate(zip(token.tolist(), logprob.tolist(), strict=True)):
            if not ended[i]:
                rows[i].append(tok)
                kept[i].append(lp)
                ended[i] = _ends(rows[i], rule, tokenizer)
        if all(ended):
            break
        ids = token.unsqueeze(1)  # (N, 1) the next forward feeds only the new tokens
    return [
        SampledSequence(row, lps, "stop" if done else "length")
        for row, lps, done in zip(rows, kept, ended, strict=True)
    ]


@torch.no_grad()
def prompt_logprobs(model: Any, prompt: list[int]) -> list[float | None]:
    """log pi(prompt[i] | prompt[:i]) at T = 1; None for the first token (nothing predicts it)."""
    ids = torch.tensor([prompt], device=model.device)  # (1, P)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1]  # (P - 1, V)
    lp, _ = token_logprobs(logits, ids[0, 1:], 1.0, False)  # (P - 1,)
    return [None, *lp.tolist()]
