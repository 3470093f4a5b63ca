"""Sampling G completions per prompt from the current policy (GRPO step 2).

A lean decode loop over the Hugging Face model with a KV cache: prompts are left-padded into one
batch, each prompt repeated G times (group by group), and each step feeds only the last token.
Per step: logits / temperature, top-k, top-p (nucleus), one multinomial draw from a seeded
`torch.Generator`. A sequence ends at EOS or at a stop string; the loop stops as soon as every
sequence has ended or `max_new_tokens` is reached. The completion mask covers the tokens up to
and including EOS (or the token that completes a stop string); the text is cut just after the
stop string. With `keep_logprobs` the loop also keeps log pi(y_t) of every sampled token under
softmax(logits / T) (before top-k / top-p: the policy's own distribution, as the training pass
computes it): pi_old when a batch is reused for several updates, at no extra forward pass.
With `keep_activations` the lean decode loop records its linear maps' outputs
(`replay.DecodeRecord`), which the on-policy training forward replays instead of recomputing.
Rows that have ended stop being decoded, a quarter of the batch at a time (`RETIRE_AT`; both
decoders): 25M model, 16 completions of 4-128 tokens (median 38), 945 -> 641 ms
(`bench/ragged_decode.py`).
`Sampler` is the interface a vLLM backend would implement.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from workers.grpo.config import GenerationParams
from workers.grpo.lean_decode import LeanDecoder
from workers.grpo.lean_forward import prompt_groups
from workers.grpo.replay import DecodeRecord

Prompt = str | list[dict[str, str]]
# Rows that have ended stop being decoded (the decoder drops them, cache rows included)
# once those still going are at most this share of the rows decoded (read at the end checks):
# each drop copies the cache, so it waits for a quarter of them to end.
RETIRE_AT = 0.75


@dataclass
class Generation:
    """A batch of N = P * G completions, group by group."""

    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P) 1 on prompt tokens
    completion_ids: Tensor  # (N, T) pad after the end
    completion_mask: Tensor  # (N, T) float, 1 up to and including EOS / stop
    texts: list[str]  # N decoded completions, cut after a stop string
    truncated: Tensor  # (N,) bool: hit max_new_tokens without EOS or stop
    logprobs: Tensor | None = None  # (N, T) log pi of each sampled token, 0 after the end
    lengths: list[int] | None = None  # N completion lengths (the mask's row sums), on the host
    record: DecodeRecord | None = None  # the decode steps' linear outputs (keep_activations)
    groups: list[int] | None = None  # N group indices on the host (a group's rows: consecutive)


class Sampler(Protocol):
    """G completions per prompt. With `keep_logprobs`, a backend that can returns
    `Generation.logprobs`; one that cannot leaves it None and pi_old is scored by a forward.
    Likewise `keep_activations` and `Generation.record` (None: the training forward computes)."""

    def generate(
        self,
        prompts: list[Prompt],
        group_size: int,
        params: GenerationParams,
        keep_logprobs: bool = False,
        keep_activations: bool = False,
    ) -> Generation: ...


def render_prompt(tokenizer: Any, prompt: Prompt) -> tuple[str, bool]:
    """Prompt text and whether it already holds special tokens (from a chat template)."""
    if isinstance(prompt, str):
        return prompt, False
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return text, True
    return "\n".join(m["content"] for m in prompt), False


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set logits outside the top-k and outside the top-p mass to -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))  # (N, V)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (N, V)
        cum = sorted_logits.softmax(-1).cumsum(-1)  # (N, V)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # (N, V) mass before it already >= p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))  # (N, V)
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)  # (N, V)
    return logits


def cache_keyword(model: Any) -> str:
    """The forward() keyword of the KV cache: `cache` (recent transformers) or `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


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
        self.model, self.cache_kw, self.cache = model, cache_keyword(model), None

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


def _retire(forward: Any, going: Tensor, live: Tensor | None) -> Tensor:
    """The forward (`LeanDecoder` or `_HFForward`) drops the decoded rows that have ended
    (`going` False, their cache rows too); the rows of the batch it decodes on (A,)."""
    keep = going.nonzero().flatten()  # (A,) into the decoded rows
    forward.retire(keep)
    return keep if live is None else live[keep]


class HFSampler:
    """Generation with a transformers causal LM and its tokenizer, seeded by `generator`.

    Llama-family models decode through `LeanDecoder` (same maths, fewer ops per token);
    `lean=False`, or any other model, uses the model's own forward. On CPU the decode loop runs
    on `cpu_threads` intra-op threads; None (the default) keeps torch's setting, one per core.
    On an idle 2-core machine two threads decode faster (16 x 32 tokens: 3M model 0.140 ->
    0.107 s, 25M 1.00 -> 0.71 s); on an oversubscribed one, where a second OpenMP thread is not
    scheduled and every op waits for it, 1 is faster.

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
    ) -> None:
        self.model, self.tokenizer, self.generator = model, tokenizer, generator
        self.lean, self.cpu_threads, self.end_check_every = lean, cpu_threads, end_check_every

    def encode_prompts(self, prompts: list[Prompt]) -> tuple[Tensor, Tensor]:
        """Left-padded ids (B, P) and mask (B, P)."""
        tok, rows = self.tokenizer, [render_prompt(self.tokenizer, p) for p in prompts]
        ids = [tok(text, add_special_tokens=not templated)["input_ids"] for text, templated in rows]
        width = max(len(r) for r in ids)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        out = torch.full((len(ids), width), pad, dtype=torch.long)  # (B, P)
        mask = torch.zeros((len(ids), width), dtype=torch.long)  # (B, P)
        for i, r in enumerate(ids):
            out[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        return out, mask

    @torch.no_grad()
    def generate(
        self,
        prompts: list[Prompt],
        group_size: int,
        params: GenerationParams,
        keep_logprobs: bool = False,
        keep_activations: bool = False,
    ) -> Generation:
        device = self.model.device
        prompt_ids, prompt_mask = self.encode_prompts(prompts)
        prompt_ids = prompt_ids.repeat_interleave(group_size, 0).to(device)  # (N, P)
        prompt_mask = prompt_mask.repeat_interleave(group_size, 0).to(device)  # (N, P)
        # inference_mode: no autograd bookkeeping per op (10-15% of a small model's decode);
        # its tensors are cloned on the way out, as the training pass saves some for backward.
        threads = self.cpu_threads if device.type == "cpu" else None
        with _intra_op_threads(threads), torch.inference_mode():
            tokens, ended, stopped, logprobs, record = self._decode(
                prompt_ids, prompt_mask, params, keep_logprobs, keep_activations
            )
        tokens, ended = tokens.clone(), ended.clone()
        logprobs = None if logprobs is None else logprobs.clone()
        out = self._finish(prompt_ids, prompt_mask, tokens, ended, stopped, params)
        if logprobs is not None:
            width = out.completion_ids.shape[1]  # pad steps after the last end are cut
            out.logprobs = logprobs[:, :width].masked_fill(out.completion_mask == 0, 0.0)
        if record is not None:
            record.lengths = out.lengths  # the replay feeds what the training forward feeds
        out.record = record
        out.groups = [row // group_size for row in range(prompt_ids.shape[0])]
        return out

    def _decode(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        params: GenerationParams,
        keep: bool,
        keep_activations: bool,
    ) -> tuple[Tensor, Tensor, list[int | None], Tensor | None, DecodeRecord | None]:
        """Sampled tokens (N, T), ended flags (N,), per-row length at a stop string, with
        `keep` the log-probs (N, T) of the sampled tokens, with `keep_activations` (lean
        decoder only) the record of the decode steps."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        pad = eos if pad is None else pad
        n, width = prompt_ids.shape
        total = width + params.max_new_tokens
        lean = LeanDecoder.build(self.model, total, rows=n) if self.lean else None
        forward = lean or _HFForward(self.model)
        record = None
        if lean is not None and keep_activations:
            record = lean.tape = DecodeRecord(self.model, n, lean.lean.lora_merged)
        logits = forward.prefill(prompt_ids, prompt_mask, params.max_new_tokens)  # (N, V)
        retires = lean is not None or forward.selects_rows()
        ended = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)  # (N,)
        check_every = self.end_check_every or (1 if prompt_ids.device.type == "cpu" else 8)
        check_every = 1 if params.stop else check_every
        stop_len: list[int | None] = [None] * n
        out, kept = [], []
        live: Tensor | None = None  # (A,) the rows the lean decoder still decodes; None: all
        for t in range(params.max_new_tokens):
            logits = logits.float()  # (N, V)
            if params.temperature != 1.0:
                logits = logits / params.temperature  # (N, V)
            probs = filter_logits(logits, params.top_k, params.top_p).softmax(-1)  # (N, V)
            nxt = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)  # (N,)
            nxt = nxt.masked_fill(ended, pad)  # (N,)
            out.append(nxt)
            if keep:  # log pi(y_t) = logit - logsumexp, unfiltered
                chosen = logits.gather(1, nxt.unsqueeze(1)).squeeze(1)  # (N,)
                kept.append(chosen - logits.logsumexp(-1))  # (N,)
            ended |= nxt == eos
            if params.stop:
                self._check_stops(torch.stack(out, 1), ended, stop_len, params.stop, t + 1)
            if t + 1 == params.max_new_tokens:
                break
            if (t + 1) % check_every == 0:
                going = ~ended if live is None else ~ended[live]  # (A,) of the rows decoded
                still = int(going.sum())  # the check's one read of the device
                if still == 0:
                    break
                if retires and still <= RETIRE_AT * going.shape[0]:
                    live = _retire(forward, going, live)
            if record is not None:
                record.begin(t, live)  # this step feeds completion token t
            if live is None:
                logits = forward.step(nxt)  # (N, V)
            else:  # the retired rows' draws (all pads) take uniform logits
                decoded = forward.step(nxt[live])  # (A, V)
                logits = decoded.new_zeros(n, decoded.shape[1]).index_copy_(0, live, decoded)
        logprobs = torch.stack(kept, 1) if keep else None  # (N, T)
        return torch.stack(out, 1), ended, stop_len, logprobs, record  # (N, T)

    def _check_stops(
        self, tokens: Tensor, ended: Tensor, stop_len: list[int | None], stops: list[str], t: int
    ) -> None:
        """Mark rows whose completion text now contains a stop string (decoding a tail window)."""
        window = 2 * max(len(s) for s in stops) + 4
        for i in (~ended).nonzero().flatten().tolist():
            text = self.tokenizer.decode(tokens[i, -window:], skip_special_tokens=True)
            if any(s in text for s in stops):
                ended[i], stop_len[i] = True, t

    def _finish(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        tokens: Tensor,
        ended: Tensor,
        stop_len: list[int | None],
        params: GenerationParams,
    ) -> Generation:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        pad = eos if pad is None else pad
        n, width = tokens.shape
        is_eos = tokens == eos  # (N, T)
        first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, width)  # (N,)
        lengths = [stop_len[i] or int(first_eos[i]) for i in range(n)]
        width = max(lengths)  # steps after the last end (if any) fed pads only: cut
        tokens = tokens[:, :width]  # (N, T)
        steps = torch.arange(width, device=tokens.device)  # (T,)
        length_t = torch.tensor(lengths, device=tokens.device)  # (N,)
        mask = (steps.unsqueeze(0) < length_t.unsqueeze(1)).float()  # (N, T)
        tokens = tokens.masked_fill(mask == 0, pad)  # (N, T)
        texts = [self._cut(tokens[i, : lengths[i]], params.stop) for i in range(n)]
        truncated = ~ended  # (N,)
        return Generation(
            prompt_ids, prompt_mask, tokens, mask, texts, truncated.cpu(), lengths=lengths
        )

    def _cut(self, ids: Tensor, stops: list[str]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        ends = [text.find(s) + len(s) for s in stops if s in text]
        return text[: min(ends)] if ends else text
