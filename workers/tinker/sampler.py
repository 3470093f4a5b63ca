"""`num_samples` sequences from one prompt, with the sampler's per-token log-probs.

All rows share the prompt, so they need no padding: the prompt is prefilled once, its KV cache
copied to every row, and the rows decoded one token at a time. Each draw is the engine's one
kernel (`workers.grpo.draw.draw`): logits / T, top-k, top-p, then the inverse CDF at the row's
own uniform, the argmax below `GREEDY_BELOW` (0 included); a row's uniforms come from `seed` and
the row's index alone (`RowSeeds`), so a seed gives the same sequences whatever else the host
does. The log-prob kept for a token is log softmax(logits / T) before top-k / top-p (the
policy's distribution, what a teacher-forced forward at the same temperature computes); greedy
rows' at T = 1. A row ends at one of the rule's token ids (kept in the sequence) or once its
text holds a stop string, found on the newly decoded text only (`workers.grpo.stops`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workers.grpo.draw import RowSeeds, RowSettings, draw, row_noise
from workers.grpo.logprobs import token_logprobs
from workers.grpo.sampling import cache_keyword
from workers.grpo.stops import StopScan
from workers.tinker.types import Deadline, SampledSequence


@dataclass(frozen=True)
class Draw:
    """A request's sampling settings (every row's)."""

    temperature: float
    top_k: int
    top_p: float


@dataclass(frozen=True)
class StopRule:
    token_ids: frozenset[int]
    strings: tuple[str, ...]


@torch.no_grad()
def sample_sequences(
    model: Any,
    tokenizer: Any,
    prompt: list[int],
    num_samples: int,
    settings: Draw,
    steps: int,
    rule: StopRule,
    seed: int,
    with_prompt_logprobs: bool = False,
    deadline: Deadline | None = None,
) -> tuple[list[SampledSequence], list[float | None] | None]:
    """The sequences and, if asked, log pi(prompt[i] | prompt[:i]) at T = 1 (None for the
    first token: nothing predicts it), from the one prefill. Past `deadline`, stopped before
    the next decoding step (TimeLimitExceeded)."""
    device, kw = model.device, cache_keyword(model)
    rows = RowSettings.uniform(settings.temperature, settings.top_k, settings.top_p,
                               num_samples, device)  # fmt: skip
    seeds = RowSeeds(seed, list(range(num_samples)))
    noise = row_noise(torch.Generator(), 0, num_samples, steps, device, seeds)  # (N, steps)
    cache, logits, first = _prefill(model, kw, prompt, num_samples, with_prompt_logprobs)
    tokens: list[list[int]] = [[] for _ in range(num_samples)]
    kept: list[list[float]] = [[] for _ in range(num_samples)]
    # stop strings are matched on the text with special tokens, as decode(row) gives it
    scans = [StopScan(tokenizer, rule.token_ids, rule.strings, False) for _ in tokens]
    for t in range(steps):
        if deadline is not None:
            deadline.check(t, steps, "decoding steps")
        token, logprob = draw(logits, rows, noise[:, t], keep=True)  # (N,), (N,)
        for i, (tok, lp) in enumerate(zip(token.tolist(), logprob.tolist(), strict=True)):
            if not scans[i].ended:
                tokens[i].append(tok)
                kept[i].append(lp)
                scans[i].push(tok)
        if all(s.ended for s in scans) or t == steps - 1:
            break
        # the next forward feeds only the new tokens (N, 1)
        out = model(input_ids=token.unsqueeze(1), use_cache=True, logits_to_keep=1, **{kw: cache})
        cache, logits = out[kw], out.logits[:, -1]  # (N, V)
    seqs = [
        SampledSequence(row, lps, "stop" if scan.ended else "length")
        for row, lps, scan in zip(tokens, kept, scans, strict=True)
    ]
    return seqs, first


def copyable(cache: Any) -> bool:
    """transformers' Cache copies its rows in place; an older or custom one may not."""
    return hasattr(cache, "batch_repeat_interleave")


def _prefill(
    model: Any, kw: str, prompt: list[int], rows: int, with_prompt_logprobs: bool
) -> tuple[Any, torch.Tensor, list[float | None] | None]:
    """The prompt's KV cache for `rows` rows, the logits (rows, V) of the first draw, and the
    prompt's log-probs if asked. The prompt runs once and its cache is copied to every row
    (a cache that cannot be copied: the prompt runs once per row)."""
    ids = torch.tensor([prompt], device=model.device)  # (1, P)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=0 if with_prompt_logprobs else 1)
    first = None
    if with_prompt_logprobs:
        lp, _ = token_logprobs(out.logits[0, :-1], ids[0, 1:], 1.0, False)  # (P - 1,)
        first = [None, *lp.tolist()]
    cache = out[kw]
    if copyable(cache):
        cache.batch_repeat_interleave(rows)  # in place: (rows, H, P, D) per layer
        return cache, out.logits[:, -1].expand(rows, -1), first  # (rows, V)
    out = model(input_ids=ids.expand(rows, -1), use_cache=True, logits_to_keep=1)
    return out[kw], out.logits[:, -1], first
