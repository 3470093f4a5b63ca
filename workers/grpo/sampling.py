"""GRPO step 2: sample G completions per prompt from the current policy (the reference decoder).

Prompts are left-padded into one batch, each repeated G times (group by group). The model's own
forward runs the prompts once, then one token at a time with its KV cache. Per token, the
engine's one draw (`draw.py`, shared with Tinker and the inference server): logits /
temperature, top-k, top-p (nucleus), one draw by the inverse of the cumulative distribution
from that row's own uniform (`row_noise`); below `draw.GREEDY_BELOW` the argmax. A row's
uniforms depend only on one
draw from the run's seeded `torch.Generator` per batch (the same on every rank) and the row's
place in the whole batch (`first_row` + its index), never on which process samples it: a
batch split across N processes samples the same completions as one process. A sequence ends
at EOS or at a stop string (`text.py`); the loop stops when every sequence has ended or after
`max_new_tokens`. Episodes (`episodes.py`) name their rows and the draw themselves (`RowSeeds`):
one draw per step, each turn's rows the episodes' places in the whole batch, so a batch whose
episodes end at different turns on different processes samples as one process does.
With `keep_logprobs` the loop also keeps
log pi(y_t) of every sampled token under softmax(logits / T), before top-k / top-p: the policy's
own distribution, as the training pass computes it. That is pi_old when a batch is reused for
several updates, at no extra forward pass.

Episodes continue a batch's KV cache across turns where the sampler can (`continues`: this
one and the fast one): `keep_cache` returns it in `Generation.continuation`, and `resume`
feeds the next turn's prompts, each that row's cached ids plus new ones, by prefilling only
the new ones (their left padding and the pads fed after a row's end are holes in the
attention mask; positions count the mask, as a re-encoded row's do), so the draws are the
re-encoding's.

`Sampler` is the interface every decoder implements (this one, `fast.sampling.FastSampler`, a
vLLM backend one day); `backend.py` chooses which one a run uses.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from workers.grpo.config import GenerationParams
from workers.grpo.draw import RowSeeds, RowSettings, draw, row_noise
from workers.grpo.draw import inverse_cdf as inverse_cdf  # the kernel's, named here as before
from workers.grpo.stops import BatchStops
from workers.grpo.text import Prompt, cut_completions, encode_groups, pad_id


@dataclass
class Generation:
    """A batch of N = P * G completions, group by group (a group's G rows are consecutive)."""

    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P) 1 on prompt tokens
    completion_ids: Tensor  # (N, T) pad after the end
    completion_mask: Tensor  # (N, T) float, 1 up to and including EOS / stop
    texts: list[str]  # N decoded completions, cut after a stop string
    truncated: Tensor  # (N,) bool: hit max_new_tokens without EOS or stop
    logprobs: Tensor | None = None  # (N, T) log pi of each sampled token, 0 after the end
    lengths: list[int] | None = None  # N completion lengths (the mask's row sums), on the host
    group_size: int | None = 1  # G; None: rows not known to come in groups of equal prompts
    backend_state: Any = None  # what the backend that sampled keeps for its forwards (opaque)
    # (N, T) float, 1 on the tokens the model sampled: an episode's completion also holds the
    # observation and tool tokens between its turns (mask 0). None: every completion token.
    model_mask: Tensor | None = None
    continuation: Continuation | None = None  # with `keep_cache`: the batch's KV cache

    @property
    def sampled_mask(self) -> Tensor:
        """(N, T) the tokens that carry loss, KL and entropy: the model's own."""
        return self.completion_mask if self.model_mask is None else self.model_mask


@dataclass
class Continuation:
    """A batch's KV cache after `generate`, to feed its rows more tokens without re-encoding
    them. `mask` (N, S) is 1 on the cached columns a later token attends to (not the left
    padding, nor what was fed after a row's end); `tokens[i]` row i's ids in those columns."""

    cache: Any  # transformers' Cache, or per layer keys, values (N, Hk, S, D)
    mask: Tensor  # (N, S)
    tokens: list[list[int]]

    def select(self, rows: list[int]) -> Continuation:
        """The state of `rows` (indices into this batch's rows), in that order; this one is
        spent (the cache selects its rows in place)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)  # (A,)
        if hasattr(self.cache, "reorder_cache"):  # transformers' Cache
            self.cache.reorder_cache(index)
            cache = self.cache
        else:  # the lean decoder's: per layer keys, values (N, Hk, S, D)
            cache = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cache]
        return Continuation(cache, self.mask[index], [self.tokens[r] for r in rows])


class Sampler(Protocol):
    """G completions per prompt. With `keep_logprobs`, a sampler that can returns
    `Generation.logprobs`; one that cannot leaves it None and pi_old is scored by a forward.
    `first_row` is the index of the batch's first row in the whole step's batch (0 in one
    process; a rank's offset when the batch is split across processes). `seeds` (one row per
    prompt x group), when given, names the noise instead (`row_noise`)."""

    def generate(
        self,
        prompts: list[Prompt],
        group_size: int,
        params: GenerationParams,
        keep_logprobs: bool = False,
        first_row: int = 0,
        seeds: RowSeeds | None = None,
    ) -> Generation: ...


def settings_of(params: GenerationParams, rows: int, device: torch.device) -> RowSettings:
    """`params`' sampling settings for every one of a batch's `rows` rows."""
    return RowSettings.uniform(params.temperature, params.top_k, params.top_p, rows, device)


def cache_keyword(model: Any) -> str:
    """The forward() keyword of the KV cache: `cache` (recent transformers) or `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def assemble(
    tokenizer: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    tokens: Tensor,
    ended: Tensor,
    stop_len: list[int | None],
    logprobs: Tensor | None,
    params: GenerationParams,
    group_size: int,
) -> Generation:
    """The Generation of sampled `tokens` (N, T), `ended` (N,) and the kept `logprobs` (N, T)."""
    tokens, mask, texts, lengths = cut_completions(tokenizer, tokens, stop_len, params.stop)
    if logprobs is not None:  # (N, T') pad steps after the last end cut, 0 after each end
        logprobs = logprobs[:, : mask.shape[1]].masked_fill(mask == 0, 0.0)
    truncated = (~ended).cpu()  # (N,)
    return Generation(
        prompt_ids, prompt_mask, tokens, mask, texts, truncated, logprobs, lengths, group_size
    )


class PlainSampler:
    """The reference decoder: the model's own forward and KV cache, one token at a time."""

    continues = True  # takes `keep_cache` and `resume` (episodes' turns continue the cache)

    def __init__(self, model: Any, tokenizer: Any, generator: torch.Generator) -> None:
        self.model, self.tokenizer, self.generator = model, tokenizer, generator

    @torch.no_grad()
    def generate(
        self,
        prompts: list[Prompt],
        group_size: int,
        params: GenerationParams,
        keep_logprobs: bool = False,
        first_row: int = 0,
        seeds: RowSeeds | None = None,
        keep_cache: bool = False,
        resume: Continuation | None = None,
    ) -> Generation:
        """With `keep_cache`, the Generation keeps its KV cache (`continuation`); with `resume`
        (the continuation of these rows, G = 1), a prompt that extends its row's cached ids
        prefills only its new ids (one that does not: every row is re-encoded)."""
        model, device, eos = self.model, self.model.device, self.tokenizer.eos_token_id
        tok = self.tokenizer
        prompt_ids, prompt_mask = encode_groups(tok, prompts, group_size, device)  # (N, P)
        n, kw = prompt_ids.shape[0], cache_keyword(model)
        steps = params.max_new_tokens
        noise = row_noise(self.generator, first_row, n, steps, device, seeds)  # (N, T)
        rows = settings_of(params, n, device)
        start = resumed_batch(resume, prompts, group_size, pad_id(tok)) if resume else None
        ids, mask, cache = (prompt_ids, prompt_mask, None) if start is None else start
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # (N, S) left padding: real tokens from 0
        positions = positions[:, -ids.shape[1] :]  # (N, S') the positions of the ids fed
        ended = torch.zeros(n, dtype=torch.bool, device=device)  # (N,)
        stop_len: list[int | None] = [None] * n
        stops = BatchStops(self.tokenizer, n, params.stop) if params.stop else None
        tokens: list[Tensor] = []
        kept: list[Tensor] = []  # with `keep_logprobs`: each step's log-probs (N,)
        for t in range(params.max_new_tokens):
            res = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                        use_cache=True, logits_to_keep=1, **{kw: cache})  # fmt: skip
            cache, cached_mask = res[kw], mask  # (N, C) the cache's columns
            token, logprob = draw(res.logits[:, -1], rows, noise[:, t], keep_logprobs)
            token = token.masked_fill(ended, pad_id(self.tokenizer))  # (N,) pads after the end
            tokens.append(token)
            if logprob is not None:
                kept.append(logprob)
            ended |= token == eos
            if stops is not None:
                stops.push(token, ended, stop_len, t + 1)
            if bool(ended.all()):
                break
            ids = token.unsqueeze(1)  # (N, 1) the next forward feeds only the new token
            positions = positions[:, -1:] + 1  # (N, 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)  # (N, S + t + 1)
        logprobs = torch.stack(kept, 1) if keep_logprobs else None  # (N, T)
        out = assemble(self.tokenizer, prompt_ids, prompt_mask, torch.stack(tokens, 1), ended,
                       stop_len, logprobs, params, group_size)  # fmt: skip
        if keep_cache:
            out.continuation = continuation_of(cache, cached_mask, out, len(tokens) - 1)
        return out


def resumed_batch(
    resume: Continuation, prompts: list[Prompt], group_size: int, pad: int
) -> tuple[Tensor, Tensor, Any] | None:
    """The ids to feed (N, W) (each row's new ids, left-padded), the mask (N, S + W) of the
    cache and those ids, and the cache; None when some prompt is not its row's cached ids
    followed by at least one new id (then the batch is re-encoded)."""
    if group_size != 1 or len(prompts) != len(resume.tokens):
        return None
    new: list[list[int]] = []
    for prompt, cached in zip(prompts, resume.tokens, strict=True):
        if not isinstance(prompt, tuple) or len(prompt) <= len(cached):
            return None
        if list(prompt[: len(cached)]) != cached:
            return None
        new.append(list(prompt[len(cached) :]))
    width, device = max(len(x) for x in new), resume.mask.device
    ids = torch.full((len(new), width), pad, dtype=torch.long)  # (N, W)
    mask = torch.zeros((len(new), width), dtype=resume.mask.dtype)  # (N, W)
    for i, x in enumerate(new):
        ids[i, width - len(x) :], mask[i, width - len(x) :] = torch.tensor(x), 1
    return ids.to(device), torch.cat([resume.mask, mask.to(device)], 1), resume.cache


def continuation_of(cache: Any, mask: Tensor, out: Generation, fed: int) -> Continuation:
    """The cache after a batch's decode: its `mask` (N, C) columns hold the prompts and the
    first `fed` sampled tokens; those after a row's end (`out.lengths`) become holes."""
    lengths = out.lengths or [int(x) for x in out.completion_mask.sum(1).tolist()]
    keep = mask.clone()  # (N, C)
    if fed:
        ends = torch.tensor(lengths, device=mask.device).unsqueeze(1)  # (N, 1)
        sampled = torch.arange(fed, device=mask.device).unsqueeze(0) < ends  # (N, fed)
        keep[:, -fed:] = sampled.to(keep.dtype)
    prompt_mask = out.prompt_mask.bool()
    ids = out.completion_ids.tolist()
    tokens = [
        out.prompt_ids[i][prompt_mask[i]].tolist() + ids[i][: min(lengths[i], fed)]
        for i in range(len(lengths))
    ]
    return Continuation(cache, keep, tokens)
