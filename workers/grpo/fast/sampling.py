"""The fast decoder: `sampling.PlainSampler`'s loop, with less work per token.

- Llama-family models decode through `lean_decode.LeanDecoder` (static KV cache, fused and
  packed weights, prompt keys and values shared by a group); any other model through its own
  forward (`_HFForward`), each distinct prompt prefilled once and its KV cache copied to its
  group's rows.
- Rows that have ended stop being decoded (their cache rows are dropped), a quarter of the
  batch at a time (`RETIRE_AT`): each drop copies the cache, so it waits for a quarter of them.
- Whether every sequence has ended is read back every `end_check_every` steps.
- With `record` (and a batch of groups, G > 1: a training rollout, not evaluation's single
  completions) the lean decoder records its linear maps' outputs (`replay.DecodeRecord`, in
  `Generation.backend_state`), which the on-policy training forward replays.
- With `keep_cache` (episodes' turns) no row retires and no prompt is shared, so that the
  batch's KV cache can be continued (`resume`, as `sampling.PlainSampler` does).
The draws are the reference decoder's (the engine's one kernel, `draw.draw`): the same per-row
uniforms (`draw.row_noise`), the retired rows' draws (all pads) taken from uniform logits.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from workers.grpo.config import GenerationParams
from workers.grpo.draw import RowSeeds, draw, row_noise
from workers.grpo.fast.graph_decode import StaticStep, applies, graphs_enabled
from workers.grpo.fast.lean_decode import LeanDecoder
from workers.grpo.fast.lean_forward import prompt_groups
from workers.grpo.fast.replay import DecodeRecord
from workers.grpo.sampling import (
    Continuation,
    Generation,
    assemble,
    cache_keyword,
    continuation_of,
    resumed_batch,
    settings_of,
)
from workers.grpo.stops import BatchStops
from workers.grpo.text import Prompt, encode_groups, pad_id

# Rows that have ended stop being decoded (the decoder drops them, cache rows included)
# once those still going are at most this share of the rows decoded (read at the end checks).
RETIRE_AT = 0.75


@contextlib.contextmanager
def _intra_op_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` inside the block (None: unchanged)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _HFForward:
    """Prefill / one-token steps through the model's own forward and its KV cache."""

    def __init__(self, model: Any) -> None:
        self.model, self.cache_kw = model, cache_keyword(model)
        self.cache: Any = None  # the model's KV cache (a transformers Cache); None: none yet

    def _run(self, ids: Tensor) -> Tensor:
        res = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=self.positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: self.cache},
        )
        self.cache = res[self.cache_kw]
        return res.logits[:, -1]  # (N, V)

    def prefill(self, ids: Tensor, mask: Tensor, max_new_tokens: int) -> Tensor:
        """Logits (N, V) of the first new token. Each distinct prompt (GRPO repeats each G
        times, consecutively) runs once; the cache then copies its keys and values to the rows
        of its group (`reorder_cache`, beam search's row selection)."""
        rows = torch.cat([ids, mask.to(ids.dtype)], 1)  # (N, 2P)
        unique, group, _ = prompt_groups(rows, None, share=True)  # (U, 2P), (N,)
        self.cache, p = None, ids.shape[1]
        if unique.shape[0] < ids.shape[0]:
            self.mask, self.positions = unique[:, p:], (unique[:, p:].cumsum(1) - 1).clamp(min=0)
            logits = self._run(unique[:, :p])  # (U, V)
            if self.selects_rows():
                self.cache.reorder_cache(group)
                self.mask, self.positions = mask, self.positions[group]  # (N, P)
                return logits[group]  # (N, V)
            self.cache = None  # a cache that cannot select rows: every row runs
        self.mask = mask  # (N, P)
        self.positions = (mask.cumsum(1) - 1).clamp(min=0)  # (N, P)
        return self._run(ids)

    def resume(self, cache: Any, ids: Tensor, mask: Tensor, max_new_tokens: int) -> Tensor:
        """Continue `cache` with the new ids (N, W); `mask` (N, C + W) its columns and theirs."""
        self.cache, self.mask = cache, mask
        self.positions = (mask.cumsum(1) - 1).clamp(min=0)[:, -ids.shape[1] :]  # (N, W)
        return self._run(ids)

    def cached(self) -> tuple[Any, Tensor]:
        """The KV cache and the mask (N, C) of its columns."""
        return self.cache, self.mask

    def step(self, tokens: Tensor) -> Tensor:
        self.positions = self.positions[:, -1:] + 1  # (N, 1)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)  # (N, P + t)
        return self._run(tokens.unsqueeze(1))

    def selects_rows(self) -> bool:
        """Whether its KV cache can keep or repeat rows (retirement, prompt sharing)."""
        return hasattr(self.cache, "reorder_cache")  # transformers' Cache classes

    def retire(self, keep: Tensor) -> None:
        """Decode on only the rows `keep` (A,) (indices into the rows decoded so far)."""
        self.cache.reorder_cache(keep)  # each layer's keys and values: those rows (beam search's)
        self.mask, self.positions = self.mask[keep], self.positions[keep]


def _retire(forward: LeanDecoder | _HFForward, going: Tensor, live: Tensor | None) -> Tensor:
    """The forward (`LeanDecoder` or `_HFForward`) drops the decoded rows that have ended
    (`going` False, their cache rows too); the rows of the batch it decodes on (A,)."""
    keep = going.nonzero().flatten()  # (A,) into the decoded rows
    forward.retire(keep)
    return keep if live is None else live[keep]


class FastSampler:
    """A `sampling.Sampler` with a transformers causal LM and its tokenizer, seeded by
    `generator`.

    `lean=False` decodes every model through its own forward. On CPU the decode loop runs on
    `cpu_threads` intra-op threads; None (the default) keeps torch's setting, one per core. On
    an oversubscribed machine, where a second OpenMP thread is not scheduled and every op waits
    for it, 1 is faster.

    `static_steps`: the lean decoder's steps with fixed shapes (`graph_decode.StaticStep`),
    captured as a CUDA graph on a GPU; None (the default): on a GPU unless `GRPO_CUDA_GRAPHS=0`.

    Whether every sequence has ended is read back every `end_check_every` steps (None: every
    step on CPU, where reading costs nothing, every 8 on an accelerator, where each read makes
    the host wait for the device instead of queueing the next step behind the running one; at
    most 7 steps of pads are decoded after the last end, and cut off). With stop strings, which
    are matched on the host, every step.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        generator: torch.Generator,
        lean: bool = True,
        cpu_threads: int | None = None,
        end_check_every: int | None = None,
        record: bool = False,
        static_steps: bool | None = None,
    ) -> None:
        self.model, self.tokenizer, self.generator = model, tokenizer, generator
        self.lean, self.cpu_threads, self.end_check_every = lean, cpu_threads, end_check_every
        self.record, self.static_steps = record, static_steps

    continues = True  # takes `keep_cache` and `resume` (episodes' turns continue the cache)

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
        """`keep_cache` and `resume`: as `sampling.PlainSampler.generate`'s."""
        device = self.model.device
        tok = self.tokenizer
        prompt_ids, prompt_mask = encode_groups(tok, prompts, group_size, device)  # (N, P)
        # inference_mode: no autograd bookkeeping per op (a small model's decode pays per op);
        # its tensors are cloned on the way out, as the training pass saves some for backward.
        threads = self.cpu_threads if device.type == "cpu" else None
        record = self.record and group_size > 1
        n = prompt_ids.shape[0]
        steps = params.max_new_tokens
        noise = row_noise(self.generator, first_row, n, steps, device, seeds)  # (N, T)
        start = resumed_batch(resume, prompts, group_size, pad_id(tok)) if resume else None
        with _intra_op_threads(threads), torch.inference_mode():
            tokens, ended, stop_len, logprobs, tape, cached = self._decode(
                prompt_ids, prompt_mask, params, keep_logprobs, record, noise, keep_cache, start
            )
        logprobs = None if logprobs is None else logprobs.clone()
        out = assemble(self.tokenizer, prompt_ids, prompt_mask, tokens.clone(), ended.clone(),
                       stop_len, logprobs, params, group_size)  # fmt: skip
        if tape is not None:
            tape.lengths = out.lengths  # the replay feeds what the training forward feeds
        out.backend_state = tape
        if cached is not None:
            out.continuation = continuation_of(*cached, out, tokens.shape[1] - 1)
        return out

    def _decode(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        params: GenerationParams,
        keep: bool,
        record: bool,
        noise: Tensor,
        keep_cache: bool = False,
        start: tuple[Tensor, Tensor, Any] | None = None,
    ) -> tuple[
        Tensor,
        Tensor,
        list[int | None],
        Tensor | None,
        DecodeRecord | None,
        tuple[Any, Tensor] | None,
    ]:
        """Sampled tokens (N, T) drawn with `noise` (N, T), ended flags (N,), per-row length at
        a stop string, with
        `keep` the log-probs (N, T) of the sampled tokens, with `record` (lean decoder only)
        the record of the decode steps, with `keep_cache` the cache and its mask (else None).
        `start`: a continued batch (`sampling.resumed_batch`), prefilled from its cache."""
        eos, pad = self.tokenizer.eos_token_id, pad_id(self.tokenizer)
        n, width = prompt_ids.shape
        rows = settings_of(params, n, prompt_ids.device)
        total = width + params.max_new_tokens  # a continued batch's prompts are its sequences
        lean = LeanDecoder.build(self.model, total, rows=n) if self.lean else None
        forward: LeanDecoder | _HFForward = lean if lean is not None else _HFForward(self.model)
        # Fixed-shape steps (CUDA graphs) on a fresh batch; they record nothing for the replay
        static = self.static_steps
        static = graphs_enabled(prompt_ids.device) if static is None else static
        static = static and lean is not None and not keep_cache and start is None and applies(lean)
        tape = None
        if lean is not None and record and not static:
            tape = lean.tape = DecodeRecord(self.model, n, lean.lean.lora_merged)
        if start is not None:
            ids, mask, cache = start
            if lean is not None and isinstance(cache, list):
                logits = lean.resume(cache, ids, mask, params.max_new_tokens)  # (N, V)
            elif isinstance(forward, _HFForward) and not isinstance(cache, list):
                logits = forward.resume(cache, ids, mask, params.max_new_tokens)  # (N, V)
            else:  # the last turn decoded the other way: re-encode
                start = None
        if start is None and lean is not None:
            share = (
                not keep_cache and not static
            )  # fixed-shape steps attend to every row's own cache
            logits = lean.prefill(prompt_ids, prompt_mask, params.max_new_tokens, share)
        elif start is None:
            logits = forward.prefill(prompt_ids, prompt_mask, params.max_new_tokens)  # (N, V)
        stepper: LeanDecoder | _HFForward | StaticStep = forward
        # every row decoded to the end check that finds them all ended
        if static and lean is not None:
            try:
                stepper = StaticStep(lean, capture=prompt_ids.device.type == "cuda")
            except RuntimeError as exc:  # not capturable here: the decoder's own steps
                warnings.warn(f"decode steps not captured as a CUDA graph: {exc}", stacklevel=2)
                static = False
        # a kept cache keeps every row: retiring would drop the rows of ended turns
        retires = not static and not keep_cache
        retires = retires and (isinstance(forward, LeanDecoder) or forward.selects_rows())
        ended = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)  # (N,)
        check_every = self.end_check_every or (1 if prompt_ids.device.type == "cpu" else 8)
        check_every = 1 if params.stop else check_every
        stop_len: list[int | None] = [None] * n
        stops = BatchStops(self.tokenizer, n, params.stop) if params.stop else None
        out: list[Tensor] = []
        kept: list[Tensor] = []  # with `keep`: each step's log-probs (N,)
        live: Tensor | None = None  # (A,) the rows the decoder still decodes; None: all
        for t in range(params.max_new_tokens):
            nxt, logprob = draw(logits, rows, noise[:, t], keep)  # (N,)
            nxt = nxt.masked_fill(ended, pad)  # (N,)
            out.append(nxt)
            if logprob is not None:
                kept.append(logprob)
            ended |= nxt == eos
            if stops is not None:
                stops.push(nxt, ended, stop_len, t + 1)
            if t + 1 == params.max_new_tokens:
                break
            if (t + 1) % check_every == 0:
                going = ~ended if live is None else ~ended[live]  # (A,) of the rows decoded
                still = int(going.sum())  # the check's one read of the device
                if still == 0:
                    break
                if retires and still <= RETIRE_AT * going.shape[0]:
                    live = _retire(forward, going, live)
            if tape is not None:
                tape.begin(t, live)  # this step feeds completion token t
            if live is None:
                logits = stepper.step(nxt)  # (N, V)
            else:  # the retired rows' draws (all pads) take uniform logits
                decoded = stepper.step(nxt[live])  # (A, V)
                logits = decoded.new_zeros(n, decoded.shape[1]).index_copy_(0, live, decoded)
        logprobs = torch.stack(kept, 1) if keep else None  # (N, T)
        cached = forward.cached() if keep_cache else None
        return torch.stack(out, 1), ended, stop_len, logprobs, tape, cached  # (N, T)
