"""The memory plan: peak memory of a GRPO run estimated from the model's shape and the spec,
and the peak measured while it runs (`peak_memory.MemoryMeter`), so that each estimate can be
checked.

Peak = weights (+ the fast path's packed copy for decoding)
     + for trained parameters: fp32 gradients and AdamW's two fp32 moments
     + the reference model (a frozen copy under full fine-tuning with beta > 0; none with LoRA,
       whose reference is the same weights with the adapter off)
     + KV cache: prompts_per_step x group_size rows x (prompt + max_new_tokens) tokens x
       layers x 2 x kv_dim
     + activations kept for the backward pass of one micro-batch (rows x (prompt +
       max_new_tokens) tokens; packed: at most micro_batch_tokens): per token and layer
       20 H + 4.4 I values, 3.75 V for the logits, and per LoRA-wrapped module 1.25 x (its
       input width + rank)
     + a fixed 80 MiB of runtime workspace (allocator, kernels' scratch).

On N > 1 devices (`resources.devices`, FSDP2: `distributed.py`) the plan is one device's, the
largest rank's: parameters, gradients and AdamW's moments are sharded (1/N each); each rank
decodes and trains only its P/N prompts, so the KV cache is 1/N and the activations are those
of min(micro_batch_size, P x G / N) rows; but every rank gathers the whole weights for
decoding (the shard stays allocated: (1 + 1/N) x the weights, where one device holds the model
and the fast path's packed copy: 2 x), and the reference copy (full training, beta > 0) is not
sharded.

The activation coefficients and the workspace were fitted on this engine's CPU runs of
Llama-shaped models (hidden 128-512, 2-8 layers, full and LoRA, against `peak_memory_bytes`):
they are the part to revisit when measured peaks say so.
Pure arithmetic, no torch: the API runs it at submission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from workers.grpo.config import TrainSpec

ACT_PER_HIDDEN, ACT_PER_INTERMEDIATE, ACT_PER_VOCAB, ACT_PER_LORA = 20.0, 4.4, 3.75, 1.25
WORKSPACE = 80 << 20
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
    g, weight_bytes, n = spec.grpo, FP32, devices
    # Under bf16 the reference copy, the KV cache and the activations are bf16 (autocast);
    # `precision: null` is planned as fp32, the larger of the two devices' defaults.
    half = BF16 if spec.precision == "bf16" else FP32
    rows = g.prompts_per_step * g.group_size // n  # this rank's (whole groups: check_world)
    batch = min(g.micro_batch_size or rows, rows)
    seq = prompt_tokens + spec.generation.max_new_tokens
    model_bytes = shape.num_parameters * weight_bytes
    # one device: the model and the decode's packed copy; N: its shard and, while decoding,
    # the whole weights gathered (no packed copy: the model's own forward, `run.open_run`)
    weights = 2 * model_bytes if n == 1 else model_bytes + _per_device(model_bytes, n)
    per_token = (
        shape.num_layers
        * (ACT_PER_HIDDEN * shape.hidden_size + ACT_PER_INTERMEDIATE * shape.intermediate_size)
        + ACT_PER_VOCAB * shape.vocab_size
    )
    if spec.lora is None:
        trained = shape.num_parameters
        reference = shape.num_parameters * half if g.beta > 0 else 0
    else:
        wrapped = [shape.modules[name] for name in lora_targets]
        trained = sum(spec.lora.r * (m["in"] + m["out"]) for m in wrapped)
        reference = 0
        per_token += ACT_PER_LORA * sum(m["in"] + spec.lora.r for m in wrapped)
    parts = {
        "weights": weights,
        "workspace": WORKSPACE,
        # gradient + AdamW exp_avg + exp_avg_sq, of this rank's shard
        "optimizer": _per_device(trained * 3 * FP32, n),
        "reference": reference,
        "kv_cache": rows * seq * shape.num_layers * 2 * shape.kv_dim * half,
        "activations": int(min(batch * seq, g.micro_batch_tokens or rows * seq) * per_token * half),
    }
    return MemoryEstimate(**parts, total=sum(parts.values()))


def _per_device(total: int, devices: int) -> int:
    """One rank's shard of `total` bytes (FSDP2 pads the last one: the larger share)."""
    return -(-total // devices)
