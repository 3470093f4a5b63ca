"""The memory plan: peak memory of a GRPO run estimated from the model's shape and the spec,
and the peak measured while it runs (`peak_memory.MemoryMeter`), so that each estimate can be
checked.

Peak = weights (+ the fast engine's packed copy for decoding)
     + for trained parameters: fp32 gradients and AdamW's two fp32 moments
     + the reference model (a frozen copy under full fine-tuning with beta > 0; none with LoRA,
       whose reference is the same weights with the adapter off)
     + KV cache of the decode: layers x 2 x kv_dim per token; the fast engine keeps each
       prompt once per group (P prompts x prompt + P x G x max_new_tokens tokens), the model's
       own decoder every row's (P x G x (prompt + max_new_tokens))
     + decode record (fast engine, when the batch trains as one micro-batch: `replay.py`):
       every linear map's output at every decode step, layers x (3 H + 2 kv_dim + 2 I) per
       completion token
     + activations autograd keeps for the backward pass of one micro-batch, counted as the
       values saved per token and layer (`LEAN`, `OWN`: by the width they scale with), plus
       three fp32 (R, V) tensors for the R scored positions' logits (the saved logits, their
       softmax and its gradient in the backward). The lean forward runs each prompt once per
       group and feeds completion positions only (plus the keys and values of each row's
       prompt, joined for its attention); the model's own forward runs every row's prompt
       and completion (with gradient checkpointing it keeps each layer's input, and one
       layer's values at a time), and its backward holds about two layers' worth more in
       flight (`OWN_BACKWARD_LAYERS`)
     + a fixed 120 MiB of runtime workspace (allocator, kernels' scratch, the libraries'
       state loaded after the meter's baseline).
The decode's parts are freed before the training forward's peak (the replay consumes the
record), yet they count beside the activations: on a CPU the heap keeps the pages of the
decode's many small tensors while the activations, large, are mapped apart, and the measured
resident peak holds both (docs/models.md has the figures).

Each part counts the longest case: every completion max_new_tokens long.

Engines: the fast one unless the spec names `reference` or `paged`, or the run needs the
model's own forward (gradient checkpointing, N > 1 devices): then the model's own forward,
no packed copy, no decode record. A model the lean forward does not cover (`fast.lean`) runs
the fast engine through its own forward: planned as the lean one (the catalog's models are
Llama-family).

On N > 1 devices (`resources.devices`, FSDP2: `distributed.py`) the plan is one device's, the
largest rank's: parameters, gradients and AdamW's moments are sharded (1/N each); each rank
decodes and trains only its P/N prompts, so the KV cache is 1/N and the activations are those
of min(micro_batch_size, P x G / N) rows; but every rank gathers the whole weights for
decoding (the shard stays allocated: (1 + 1/N) x the weights), and the reference copy (full
training, beta > 0) is not sharded.

The per-layer counts were fitted to the bytes autograd saves (saved-tensor hooks) in the
training forward of Llama-shaped models: hidden 256 with intermediate 512 and 2048, and
SmolLM2-135M (hidden 576, intermediate 1536, kv_dim 192); the workspace to measured peaks
(tests/workers/grpo/test_memory.py, tests/e2e/test_real_model.py).
Pure arithmetic, no torch: the API runs it at submission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from workers.grpo.config import TrainSpec

# Values autograd keeps per token and layer: x hidden_size, x kv_dim, x intermediate_size
LEAN = (10.5, 4.7, 3.6)  # the fast engine's lean forward (`fast/lean_forward.py`)
OWN = (7.1, 3.5, 4.0)  # the model's own (transformers') forward
# and its backward holds about two layers' worth more in flight (gradients of one layer's
# saved values, the attention's scratch): fitted to the tiny model's (4 layers) and
# SmolLM2's (30 layers) measured peaks, docs/models.md
OWN_BACKWARD_LAYERS = 2
LOGIT_COPIES = 3  # the scored positions' fp32 logits, their softmax and its gradient
ACT_PER_LORA = 1.25  # per LoRA-wrapped module and token: x (its input width + rank)
WORKSPACE = 120 << 20
FP32, BF16 = 4, 2


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model (the catalog records it at `models add`)."""

    num_parameters: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    kv_dim: int
    vocab_size: int
    # modules LoRA can wrap: full name -> {"in", "out", "kind": linear | output | embedding}
    modules: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes, by part; `total` is their sum."""

    weights: int
    workspace: int
    optimizer: int  # gradients and AdamW moments of the trained parameters
    reference: int
    kv_cache: int
    decode_record: int  # the fast engine's decode outputs, replayed by the training forward
    activations: int
    total: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def select_lora_targets(
    modules: dict[str, dict[str, Any]],
    target_modules: str | list[str],
    fullmatch: Callable[[str, str], bool],
) -> list[str]:
    """The modules peft wraps: 'all-linear' (every linear map but the LM head), names matched
    on their last parts, or a pattern over full names (`fullmatch(pattern, name)`)."""
    if target_modules == "all-linear":
        return [n for n, m in modules.items() if m["kind"] == "linear"]
    if isinstance(target_modules, str):
        return [n for n in modules if fullmatch(target_modules, n)]
    return [n for n in modules if any(n == t or n.endswith("." + t) for t in target_modules)]


def fast_engine(spec: TrainSpec, devices: int) -> bool:
    """Whether the run decodes and trains through the fast engine (`backend.select_backend`)."""
    own = spec.gradient_checkpointing or devices > 1
    return not own and spec.grpo.engine not in ("reference", "paged")


def estimate_memory(
    shape: ModelShape,
    spec: TrainSpec,
    prompt_tokens: int,
    lora_targets: list[str],
    devices: int = 1,
) -> MemoryEstimate:
    """Peak bytes on one device of a run of `spec` on `devices` devices whose longest prompt
    is `prompt_tokens` tokens; `lora_targets` are the modules the adapter wraps
    (select_lora_targets), unused without LoRA."""
    g, n, s = spec.grpo, devices, shape
    # Under bf16 the reference copy, the KV cache and the activations are bf16 (autocast);
    # `precision: null` is planned as fp32, the larger of the two devices' defaults.
    half = BF16 if spec.precision == "bf16" else FP32
    prompts = max(1, g.prompts_per_step // n)  # this rank's (whole groups: check_world)
    rows = prompts * g.group_size
    new = spec.generation.max_new_tokens
    fast = fast_engine(spec, n)
    model_bytes = s.num_parameters * FP32
    # one device: the model, and the fast engine's packed copy; N: its shard and, while
    # decoding, the whole weights gathered
    weights = (2 if fast else 1) * model_bytes
    if n > 1:
        weights = model_bytes + _per_device(model_bytes, n)
    if spec.lora is None:
        trained = s.num_parameters
        reference = s.num_parameters * half if g.beta > 0 else 0
        lora_width = 0
    else:
        wrapped = [s.modules[name] for name in lora_targets]
        trained = sum(spec.lora.r * (m["in"] + m["out"]) for m in wrapped)
        reference = 0
        lora_width = sum(m["in"] + spec.lora.r for m in wrapped)
    cached = prompts * prompt_tokens + rows * new if fast else rows * (prompt_tokens + new)
    one_batch = (g.micro_batch_size or rows) >= rows and g.micro_batch_tokens is None
    record_width = 3 * s.hidden_size + 2 * s.kv_dim + 2 * s.intermediate_size
    parts = {
        "weights": weights,
        "workspace": WORKSPACE,
        # gradient + AdamW exp_avg + exp_avg_sq, of this rank's shard
        "optimizer": _per_device(trained * 3 * FP32, n),
        "reference": reference,
        "kv_cache": cached * s.num_layers * 2 * s.kv_dim * half,
        "decode_record": rows * new * s.num_layers * record_width * half * (fast and one_batch),
        "activations": _activations(s, spec, prompt_tokens, rows, fast, lora_width, half),
    }  # fmt: skip
    return MemoryEstimate(**parts, total=sum(parts.values()))


def _activations(
    s: ModelShape,
    spec: TrainSpec,
    prompt_tokens: int,
    rows: int,
    fast: bool,
    lora_width: int,
    half: int,
) -> int:
    """Bytes one micro-batch keeps for its backward pass (its largest: every completion
    max_new_tokens long)."""
    g, new = spec.grpo, spec.generation.max_new_tokens
    batch = min(g.micro_batch_size or rows, rows)
    e, kv, i = s.hidden_size, s.kv_dim, s.intermediate_size
    if fast and g.micro_batch_tokens is None:
        groups = min(-(-batch // g.group_size), -(-rows // g.group_size))
        tokens = groups * prompt_tokens + batch * max(0, new - 1)  # prompts once, completions
        joined = batch * (prompt_tokens + new) * 2 * kv  # each row's keys and values
        per_layer = tokens * (LEAN[0] * e + LEAN[1] * kv + LEAN[2] * i) + joined
        kept = s.num_layers * per_layer
        scored = batch * new
    else:
        tokens = batch * (prompt_tokens + new)
        if g.micro_batch_tokens is not None:  # packed end to end: at most that many
            tokens = min(tokens, g.micro_batch_tokens)
        per_layer = tokens * (OWN[0] * e + OWN[1] * kv + OWN[2] * i)
        # with gradient checkpointing each layer's input, and one layer recomputed at a time
        stored = s.num_layers * tokens * e + per_layer if spec.gradient_checkpointing else (
            s.num_layers * per_layer)  # fmt: skip
        kept = stored + OWN_BACKWARD_LAYERS * per_layer
        scored = tokens * new // (prompt_tokens + new)
    lora = ACT_PER_LORA * lora_width * tokens
    return int((kept + lora) * half + LOGIT_COPIES * scored * s.vocab_size * FP32)


def _per_device(total: int, devices: int) -> int:
    """One rank's shard of `total` bytes (FSDP2 pads the last one: the larger share)."""
    return -(-total // devices)
