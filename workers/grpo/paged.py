"""The `paged` engine: rollouts decoded by transformers' continuous batching (paged attention).

`PagedSampler` hands the batch's rows (each prompt repeated G times) to a
`ContinuousBatchingManager` (the path of `model.generate_batch`, and of TRL's
`use_transformers_continuous_batching`): a paged KV cache of fixed-size blocks, a scheduler that
admits rows as blocks free up, prefill and decode of different rows in one ragged forward, and
on CUDA its CUDA graphs / compiled decode. Each row draws with the engine's kernel (below); a
row ends at EOS or at `max_new_tokens`. Scoring and training run the
model's own forward (`backend.PagedBackend` is the reference backend with this sampler).

What it honours, and how:
- the draw: the engine's one kernel (`draw.draw`) with each row's seeded uniforms
  (`draw.row_noise`'s), run inside the manager as a per-request logits processor
  (`paged_draw.RowDraw`): temperature, top-k, top-p and the greedy floor as every decoder has
  them, and the same completions as the reference sampler for the same seed, so a batch split
  over N processes samples as one. EOS and `max_new_tokens` end a row in the manager.
- stop strings after the decode: a row's end is the first step at which its text holds a stop
  string, found as the reference loop finds it (`stops.BatchStops`); the tokens decoded after
  it are cut (continuous batching has no stop strings).
- the sampler's log-probs: the drawn token's log softmax(logits / T), kept by `RowDraw` as it
  draws (what the other decoders keep), except under autocast: the manager's thread runs
  outside the caller's bf16 autocast, in the weights' own dtype, so pi_old is then scored by a
  forward, as for any sampler without them.
- LoRA: the manager runs the peft-wrapped base model, so the adapters apply at every step
  (nothing is merged). Weights updated in place by the optimizer are read live.
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
from workers.grpo.draw import RowSeeds, row_noise
from workers.grpo.paged_support import paged_refusal
from workers.grpo.sampling import Generation, assemble, settings_of
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
    """One manager (a paged cache sized for `blocks` blocks) and the draw it runs."""

    manager: Any
    row_draw: Any  # paged_draw.RowDraw (transformers' batching is imported when it is built)
    blocks: int
    page_size: int

    def fits(self, rows: list[list[int]], longest: int, new_tokens: int) -> bool:
        cache = len(rows) * _pages(longest, self.page_size) <= self.blocks
        return cache and self.row_draw.fits(len(rows), new_tokens)


class PagedSampler:
    """G completions per prompt through a `ContinuousBatchingManager` of the model."""

    continues = False  # episodes re-encode each turn's sequences

    def __init__(self, model: Any, tokenizer: Any, generator: torch.Generator) -> None:
        self.model, self.tokenizer, self.generator = model, tokenizer, generator
        # One manager per setting of the draw (training's, evaluation's greedy one): a
        # captured CUDA graph holds the draw's settings as constants.
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
        steps = params.max_new_tokens
        noise = row_noise(self.generator, first_row, len(rows), steps, device, seeds)  # (N, T)
        outputs, drawn = self._decode(rows, params, noise)
        tokens = _padded(outputs, pad_id(tok))  # (N, T)
        ended, stop_len = _ends(tok, tokens, params.stop)
        logprobs = drawn[:, : tokens.shape[1]] if keep_logprobs else None
        if _autocast_on(device):  # drawn in the weights' dtype, not the forward's
            logprobs = None
        return assemble(tok, prompt_ids, prompt_mask, tokens.to(device), ended.to(device),
                        stop_len, logprobs, params, group_size)  # fmt: skip

    def _decode(
        self, rows: list[list[int]], params: GenerationParams, noise: Tensor
    ) -> tuple[list[Any], Tensor]:
        """Every row's `GenerationOutput`, in row order, and the drawn tokens' log-probs (N, T)."""
        decoder = self._decoder(rows, params)
        manager, device = decoder.manager, self.model.device
        settings = settings_of(params, 1, device)  # reads alike for any number of rows
        # The manager reseeds torch's global generator as it starts (for tensor parallelism):
        # the run's own draws outside the decode stay as without it.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            manager.start()
            try:
                # Paused, the loop takes every request at its next step, after `begin` has
                # named each request's row.
                with manager.pause():
                    ids = manager.add_requests(rows, max_new_tokens=params.max_new_tokens)
                    decoder.row_draw.begin(ids, noise, settings)
                done = _collect(manager, ids)
            finally:
                manager.stop(block=True, keep_for_next_session=True)
        drawn = decoder.row_draw.kept_logprobs(len(rows), params.max_new_tokens)
        return [done[i] for i in ids], drawn

    def _decoder(self, rows: list[list[int]], params: GenerationParams) -> _Decoder:
        """The manager of these draw settings, rebuilt when its cache or its draw's tables are
        too small."""
        key = (params.temperature, params.top_k, params.top_p)
        longest = max(len(r) for r in rows) + params.max_new_tokens
        decoder = self.decoders.get(key)
        if decoder is not None and decoder.fits(rows, longest, params.max_new_tokens):
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

    from workers.grpo.paged_draw import RowDraw, RowDrawList

    # Pages as long as the longest row (16 to 256 tokens): every row holds whole pages.
    page_size = min(256, max(16, 1 << (longest - 1).bit_length()))
    blocks = len(rows) * _pages(longest, page_size)
    generation = GenerationConfig(
        do_sample=False,  # the argmax of `RowDraw`'s one-hot logits: our draw
        max_new_tokens=params.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id(tokenizer),
    )
    batching = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=blocks,
        # a forward takes every row's prompt at once, or all rows' next tokens
        max_batch_tokens=max(len(rows), min(8192, sum(len(r) for r in rows))),
        # CUDA graphs of transformers' own decode, opt-in until measured faster on a GPU
        use_cuda_graph=True if os.environ.get("GRPO_PAGED_CUDA_GRAPHS") == "1" else None,
    )
    hints = WorkloadHints(max(len(r) for r in rows), params.max_new_tokens, len(rows))
    manager = ContinuousBatchingManager(_base_model(model), generation, batching, hints)
    row_draw = RowDraw(len(rows), params.max_new_tokens, model.device)
    manager.logit_processor = RowDrawList(row_draw)  # read when its thread starts
    return _Decoder(manager, row_draw, blocks, page_size)


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


def _padded(outputs: list[Any], pad: int) -> Tensor:
    """Sampled ids (N, T) padded after each row's end."""
    width = max(1, max(len(o.generated_tokens) for o in outputs))
    tokens = torch.full((len(outputs), width), pad, dtype=torch.long)  # (N, T)
    for i, o in enumerate(outputs):
        tokens[i, : len(o.generated_tokens)] = torch.tensor(o.generated_tokens, dtype=torch.long)
    return tokens


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
