"""The `paged` engine: rollouts decoded by transformers' continuous batching (paged attention).

`PagedSampler` hands the batch's rows (each prompt repeated G times) to a
`ContinuousBatchingManager` (the path of `model.generate_batch`, and of TRL's
`use_transformers_continuous_batching`): a paged KV cache of fixed-size blocks, a scheduler that
admits rows as blocks free up, prefill and decode of different rows in one ragged forward, and
on CUDA its CUDA graphs / compiled decode. Each row is sampled by softmax(processed logits) and
`torch.multinomial`; a row ends at EOS or at `max_new_tokens`. Scoring and training run the
model's own forward (`backend.PagedBackend` is the reference backend with this sampler).

What it honours, and how:
- temperature, top-k, top-p: transformers' logits warpers (top-k 1 is greedy); EOS and
  `max_new_tokens` by the manager. Stop strings after the decode: a row's end is the first step
  at which its text holds a stop string, found as the reference loop finds it (`stops.BatchStops`);
  the tokens decoded after it are cut (continuous batching has no stop strings).
- the sampler's log-probs: the manager's log of the sampled token's probability, which is
  log softmax(logits / T) when nothing filters the distribution. They are returned only then
  (top-k 0, top-p 1) and when the decode runs in the precision of the training forward (no
  autocast: the manager's thread runs outside the caller's bf16 autocast, in the weights' own
  dtype); otherwise pi_old is scored by a forward, as for any sampler without them.
- LoRA: the manager runs the peft-wrapped base model, so the adapters apply at every step
  (nothing is merged). Weights updated in place by the optimizer are read live.
- the draw (`_draw_settings`, the one decoder not drawing through the engine's kernel,
  `draw.py`): transformers 5.25 offers no public way to run our draw inside its batching (see
  `_draw_settings`, docs/engine.md), so the draws come from torch's global generator
  (multinomial), seeded per batch from one draw of the run's generator (or the episode's named
  base and rows) and restored afterwards; a temperature below `GREEDY_BELOW` is greedy. The
  same run on the same process layout samples the same completions; per-row noise
  (`row_noise`) is not honoured, so a batch split over N processes samples other (equally
  distributed) completions than one process, and `first_row` only enters the seed.
- episodes: every turn re-encodes the sequences so far (`continues` is False).

`serving_refusal(model)` says why a loaded model cannot be served (families outside
`paged_support.PAGED_MODEL_TYPES`, attention outside the attention interface, layers other
than full attention).
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from workers.grpo.config import GenerationParams
from workers.grpo.draw import GREEDY_BELOW, RowSeeds, draw_base
from workers.grpo.paged_support import paged_refusal
from workers.grpo.sampling import Generation, assemble
from workers.grpo.stops import BatchStops
from workers.grpo.text import Prompt, encode_groups, pad_id

# Attention implementations continuous batching runs (eager is switched to paged|eager).
_ATTENTION = ("sdpa", "eager", "paged|eager")
RESULT_POLL_SECONDS = 1.0


def _base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (its LoRA layers are inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def serving_refusal(model: Any) -> str | None:
    """Why the paged engine cannot decode `model`, or None when it can."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    if config is None or not hasattr(base, "init_continuous_batching"):
        return "not a transformers causal LM with continuous batching"
    if not _manager_pauses():
        import transformers

        version = transformers.__version__
        return f"transformers {version} cannot pause its batching: paged needs 5.25 or later"
    reason = paged_refusal(getattr(config, "model_type", "?"))
    if reason is not None:
        return reason
    if not getattr(base, "_supports_attention_backend", False):
        return f"{type(base).__name__} does not run its attention through the attention interface"
    layers = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layers != {"full_attention"}:
        return f"layers of types {sorted(layers)}: the paged engine decodes full attention only"
    attention = config._attn_implementation or "eager"
    if attention not in _ATTENTION and not attention.startswith("flash_attention"):
        return f"attention implementation {attention!r}: use sdpa, eager or flash attention"
    return None


def _manager_pauses() -> bool:
    """Whether this transformers' manager has `pause()`: requests added while paused start in
    one batch, so a seed fixes the draws (older versions start them as the thread runs)."""
    from transformers.generation.continuous_batching import ContinuousBatchingManager

    return hasattr(ContinuousBatchingManager, "pause")


@dataclass
class _Decoder:
    """One manager (a paged cache sized for `blocks` blocks) for one setting of the warpers."""

    manager: Any
    blocks: int
    page_size: int


class PagedSampler:
    """G completions per prompt through a `ContinuousBatchingManager` of the model."""

    continues = False  # episodes re-encode each turn's sequences

    def __init__(self, model: Any, tokenizer: Any, generator: torch.Generator) -> None:
        self.model, self.tokenizer, self.generator = model, tokenizer, generator
        self.decoders: dict[tuple[float, int, float], _Decoder] = {}
        # Managers are dropped while the interpreter still runs (theirs reach modules on exit).
        weakref.finalize(self, self.decoders.clear)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[Prompt],
        group_size: int,
        params: GenerationParams,
        keep_logprobs: bool = False,
        first_row: int = 0,
        seeds: RowSeeds | None = None,
    ) -> Generation:
        tok, device = self.tokenizer, self.model.device
        prompt_ids, prompt_mask = encode_groups(tok, prompts, group_size, device)  # (N, P)
        ids_host, mask_host = prompt_ids.cpu(), prompt_mask.cpu().bool()
        rows = [ids_host[i][mask_host[i]].tolist() for i in range(ids_host.shape[0])]
        base = draw_base(self.generator) if seeds is None else seeds.base
        names = range(first_row, first_row + len(rows)) if seeds is None else seeds.rows
        seed = hash((base, *names)) % 2**63  # ints hash alike in every process
        outputs = self._decode(rows, params, seed)
        tokens, logprobs = _padded(outputs, pad_id(tok))  # (N, T), (N, T)
        ended, stop_len = _ends(tok, tokens, params.stop)
        exact = params.top_k == 0 and params.top_p == 1.0 and not _autocast_on(device)
        exact = exact and params.temperature >= GREEDY_BELOW  # greedy: the manager's at T = 1
        return assemble(tok, prompt_ids, prompt_mask, tokens.to(device), ended.to(device),
                        stop_len, logprobs.to(device) if keep_logprobs and exact else None,
                        params, group_size)  # fmt: skip

    def _decode(self, rows: list[list[int]], params: GenerationParams, seed: int) -> list[Any]:
        """Every row's `GenerationOutput`, in row order; the global generator is restored."""
        decoder = self._decoder(rows, params)
        manager, device = decoder.manager, self.model.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            manager.start()
            try:
                # Paused, the loop takes every request at its next step: the batches, and so
                # the order of the draws, depend on the rows only, not on thread timing.
                with manager.pause():
                    torch.manual_seed(seed)
                    ids = manager.add_requests(rows, max_new_tokens=params.max_new_tokens)
                done = _collect(manager, ids)
            finally:
                manager.stop(block=True, keep_for_next_session=True)
        return [done[i] for i in ids]

    def _decoder(self, rows: list[list[int]], params: GenerationParams) -> _Decoder:
        """The manager of these warper settings, rebuilt when its cache is too small."""
        key = (params.temperature, params.top_k, params.top_p)
        longest = max(len(r) for r in rows) + params.max_new_tokens
        decoder = self.decoders.get(key)
        if decoder is not None and len(rows) * _pages(longest, decoder.page_size) <= decoder.blocks:
            return decoder
        if decoder is not None:
            decoder.manager.destroy()
        self.decoders[key] = decoder = _new_decoder(self.model, self.tokenizer, params, rows,
                                                    longest)  # fmt: skip
        return decoder


def _new_decoder(
    model: Any, tokenizer: Any, params: GenerationParams, rows: list[list[int]], longest: int
) -> _Decoder:
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import ContinuousBatchingManager
    from transformers.generation.continuous_batching.utils import WorkloadHints

    # Pages as long as the longest row (16 to 256 tokens): every row holds whole pages.
    page_size = min(256, max(16, 1 << (longest - 1).bit_length()))
    blocks = len(rows) * _pages(longest, page_size)
    generation = GenerationConfig(
        **_draw_settings(params),
        max_new_tokens=params.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id(tokenizer),
    )
    batching = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=blocks,
        # a forward takes every row's prompt at once, or all rows' next tokens
        max_batch_tokens=max(len(rows), min(8192, sum(len(r) for r in rows))),
        return_logprobs=True,
        # CUDA graphs of transformers' own decode, opt-in until measured faster on a GPU
        use_cuda_graph=True if os.environ.get("GRPO_PAGED_CUDA_GRAPHS") == "1" else None,
    )
    hints = WorkloadHints(max(len(r) for r in rows), params.max_new_tokens, len(rows))
    manager = ContinuousBatchingManager(_base_model(model), generation, batching, hints)
    return _Decoder(manager, blocks, page_size)


def _draw_settings(params: GenerationParams) -> dict[str, Any]:
    """Paged's draw, the one decoder not drawing through the engine's kernel (`draw.py`): the
    manager's own sampling step (transformers' warpers, then `torch.multinomial` from torch's
    global generator, seeded per batch in `PagedSampler._decode`; the argmax below
    `GREEDY_BELOW`). transformers 5.25 has no public hook to replace it: the manager builds its
    logits processors from the GenerationConfig alone (no custom processor can be passed), only
    its built-in warpers receive per-request arguments, and the draw itself is its batch
    processor's private `_sample`, given neither a request's identity nor its step."""
    if params.temperature < GREEDY_BELOW:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": params.temperature,
            "top_k": params.top_k or None, "top_p": params.top_p}  # fmt: skip


def _pages(length: int, page_size: int) -> int:
    return math.ceil(length / page_size)


def _collect(manager: Any, ids: list[str]) -> dict[str, Any]:
    """The finished outputs of `ids`; an error of the manager or of a request is raised."""
    done: dict[str, Any] = {}
    while len(done) < len(ids):
        out = manager.get_result(timeout=RESULT_POLL_SECONDS)
        if out is None:
            error = manager.background_thread_status.fatal_error
            if error is not None or not manager.is_running():
                raise RuntimeError(f"continuous batching stopped with {len(ids) - len(done)} rows"
                                   f" left: {error or 'the generation thread exited'}")  # fmt: skip
            continue
        if out.error is not None:
            raise RuntimeError(f"continuous batching failed a row: {out.error}")
        if out.is_finished():
            done[out.request_id] = out
    return done


def _padded(outputs: list[Any], pad: int) -> tuple[Tensor, Tensor]:
    """Sampled ids (N, T) padded after each row's end, and their log-probs (N, T), 0 there."""
    width = max(1, max(len(o.generated_tokens) for o in outputs))
    tokens = torch.full((len(outputs), width), pad, dtype=torch.long)  # (N, T)
    logprobs = torch.zeros((len(outputs), width), dtype=torch.float32)  # (N, T)
    for i, o in enumerate(outputs):
        tokens[i, : len(o.generated_tokens)] = torch.tensor(o.generated_tokens, dtype=torch.long)
        if o.logprobs:
            logprobs[i, : len(o.logprobs)] = torch.tensor(o.logprobs, dtype=torch.float32)
    return tokens, logprobs


def _ends(tokenizer: Any, tokens: Tensor, stops: list[str]) -> tuple[Tensor, list[int | None]]:
    """Which rows ended (N,) (EOS or a stop string) and where a stop string ended each, step by
    step as the reference loop looks for them, on the whole decoded rows."""
    ended = torch.zeros(tokens.shape[0], dtype=torch.bool)  # (N,)
    stop_len: list[int | None] = [None] * tokens.shape[0]
    is_eos = tokens == tokenizer.eos_token_id  # (N, T)
    if not stops:
        return is_eos.any(1), stop_len
    scans = BatchStops(tokenizer, tokens.shape[0], stops)
    for t in range(tokens.shape[1]):
        ended |= is_eos[:, t]
        scans.push(tokens[:, t], ended, stop_len, t + 1)
        if bool(ended.all()):
            break
    return ended, stop_len


def _autocast_on(device: torch.device) -> bool:
    return torch.is_autocast_enabled(device.type)
