"""The memory plan against what a run measures: the estimate at submission is within 25% of
the peak the trainer reports (`peak_memory_bytes`), on CPU, for the tiny model with and
without LoRA. Each run is a fresh process, as a worker's job is, so the peak is its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.catalog.inspect import inspect_model
from workers.grpo.config import TrainSpec
from workers.grpo.memory import ModelShape, estimate_memory, select_lora_targets

PROMPT_TOKENS = 20  # "x" * 19 and <bos>: one token per character

RUN = """
import json, sys, tempfile
from pathlib import Path
from workers.grpo.config import TrainSpec
from workers.grpo.trainer import TrainHooks, train

class Lengths:
    name, weight = "len", 1.0
    def score(self, samples):
        return [float(len(s["completion"]) % 3) for s in samples], [None] * len(samples)

spec = TrainSpec.model_validate_json(sys.argv[1])
steps = {}
hooks = TrainHooks(on_step=lambda step, m: steps.__setitem__(step, m))
with tempfile.TemporaryDirectory() as work:
    train(spec, [{"prompt": "x" * 19}] * 8, [Lengths()], Path(work), hooks)
print(json.dumps(max(m["peak_memory_bytes"] for m in steps.values())))
"""

SHAPES = {
    "full": {},
    "full, small batch": {"grpo": {"prompts_per_step": 2, "group_size": 8},
                          "generation": {"max_new_tokens": 16}},
    "lora all-linear": {"lora": {"r": 16}},
    "lora q,v": {"lora": {"r": 16, "target_modules": ["q_proj", "v_proj"]}},
    "micro-batches of 16": {"grpo": {"micro_batch_size": 16}},
    "own forward": {"grpo": {"engine": "reference"}},
}  # fmt: skip


def _spec(model: Path, overrides: dict) -> TrainSpec:
    # Two steps: AdamW's moments exist from the first optimizer step on, so the second step's
    # peak is the run's steady peak.
    body = {
        "base_model": str(model),
        "grpo": {"steps": 2, "prompts_per_step": 4, "group_size": 16, "learning_rate": 1e-3}
        | overrides.get("grpo", {}),
        "generation": {"max_new_tokens": 64} | overrides.get("generation", {}),
        "lora": overrides.get("lora"),
        "checkpoint_every": 1000,
    }
    return TrainSpec.model_validate(body)


@pytest.mark.parametrize("case", list(SHAPES))
def test_the_estimate_is_within_25_percent_of_the_measured_peak(
    tiny_model_dir: Path, case: str
) -> None:
    spec = _spec(tiny_model_dir, SHAPES[case])
    shape = _shape(tiny_model_dir)
    fullmatch = lambda p, n: re.fullmatch(p, n) is not None  # noqa: E731
    targets = select_lora_targets(shape.modules, spec.lora.target_modules, fullmatch) if (
        spec.lora) else []  # fmt: skip
    estimate = estimate_memory(shape, spec, PROMPT_TOKENS, targets)
    out = subprocess.run(
        [sys.executable, "-c", RUN, spec.model_dump_json()],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    ratio = estimate.total / measured
    print(f"{case}: estimate {estimate.total / 2**20:.0f} MiB, measured "
          f"{measured / 2**20:.0f} MiB, ratio {ratio:.2f}")  # fmt: skip
    assert 0.75 <= ratio <= 1.25, (estimate, measured)


def test_the_plan_follows_the_spec(tiny_model_dir: Path) -> None:
    """Hand-checkable parts: bf16 halves the reference, KV cache and decode record; the fast
    engine caches each prompt once per group and keeps a decode record only for one
    micro-batch; a micro-batch of a quarter of the rows keeps a quarter of the activations;
    the model's own forward caches every row's prompt and has no packed copy."""
    facts = inspect_model(tiny_model_dir, "local")
    shape = _shape(tiny_model_dir)
    fp32 = estimate_memory(shape, _spec(tiny_model_dir, {}), PROMPT_TOKENS, [])
    bf16 = estimate_memory(
        shape, _spec(tiny_model_dir, {}).model_copy(update={"precision": "bf16"}), 20, []
    )
    assert (bf16.reference, bf16.kv_cache) == (fp32.reference // 2, fp32.kv_cache // 2)
    assert bf16.decode_record == fp32.decode_record // 2 > 0
    assert bf16.activations < fp32.activations
    assert bf16.weights == fp32.weights and bf16.optimizer == fp32.optimizer
    # (4 prompts x 20 + 64 rows x 64 new) tokens x 4 layers x 2 x 256 x 4 bytes
    assert fp32.kv_cache == (4 * 20 + 64 * 64) * 4 * 2 * 256 * 4
    # 64 rows x 64 steps x 4 layers x (3 x 256 + 2 x 256 + 2 x 512) outputs x 4 bytes
    assert fp32.decode_record == 64 * 64 * 4 * (3 * 256 + 2 * 256 + 2 * 512) * 4
    quarter = estimate_memory(shape, _spec(tiny_model_dir, {"grpo": {"micro_batch_size": 16}}),
                              20, [])  # fmt: skip
    assert abs(quarter.activations - fp32.activations / 4) <= 1 and quarter.decode_record == 0
    assert fp32.optimizer == 3 * 4 * facts.num_parameters  # gradient + two AdamW moments
    own = estimate_memory(shape, _spec(tiny_model_dir, {"grpo": {"engine": "reference"}}), 20, [])
    assert own.kv_cache == 64 * (20 + 64) * 4 * 2 * 256 * 4 and own.decode_record == 0
    assert own.weights == fp32.weights // 2  # no packed copy


def test_the_plan_on_n_devices_is_one_ranks_share(tiny_model_dir: Path) -> None:
    """FSDP2 over N devices (the model's own forward): the optimizer state 1/N, the KV cache
    and activations of P/N prompts; the whole weights gathered for decoding beside the shard;
    the reference whole."""
    facts = inspect_model(tiny_model_dir, "local")
    shape = _shape(tiny_model_dir)
    spec = _spec(tiny_model_dir, {})  # 4 prompts x 16, full training, beta > 0
    fast = estimate_memory(shape, spec, PROMPT_TOKENS, [])
    # one device through the same forward as N: the engine N ranks use
    one = estimate_memory(
        shape, _spec(tiny_model_dir, {"grpo": {"engine": "reference"}}), PROMPT_TOKENS, []
    )
    model = 4 * facts.num_parameters
    assert fast.weights == 2 * model and one.weights == model  # the fast one's packed copy
    for n in (2, 4):
        part = estimate_memory(shape, spec, PROMPT_TOKENS, [], devices=n)
        assert part.weights == model + -(-model // n)  # gathered whole, and the shard
        assert part.optimizer == -(-one.optimizer // n)
        assert part.kv_cache == one.kv_cache // n and part.decode_record == 0
        assert abs(part.activations - one.activations / n) <= 1
        assert (part.reference, part.workspace) == (one.reference, one.workspace) != (0, 0)
        assert part.total == sum(v for k, v in part.as_dict().items() if k != "total")
        assert part.total < fast.total
    # A micro-batch smaller than a rank's rows keeps the same activations on any count...
    small = _spec(tiny_model_dir, {"grpo": {"micro_batch_size": 8, "engine": "reference"}})
    per_mb = estimate_memory(shape, small, PROMPT_TOKENS, []).activations
    assert estimate_memory(shape, small, PROMPT_TOKENS, [], devices=4).activations == per_mb
    # ...and a larger one is bounded by the rank's 16 rows: half of the 32-row micro-batch's.
    large = _spec(tiny_model_dir, {"grpo": {"micro_batch_size": 32, "engine": "reference"}})
    per_rank = estimate_memory(shape, large, PROMPT_TOKENS, [], devices=4).activations
    assert abs(per_rank - estimate_memory(shape, large, PROMPT_TOKENS, []).activations / 2) <= 1
    lora = _spec(tiny_model_dir, {"lora": {"r": 16}})
    fullmatch = lambda p, n: re.fullmatch(p, n) is not None  # noqa: E731
    targets = select_lora_targets(shape.modules, "all-linear", fullmatch)
    lora_one = estimate_memory(shape, lora, PROMPT_TOKENS, targets)
    lora_two = estimate_memory(shape, lora, PROMPT_TOKENS, targets, devices=2)
    assert lora_two.optimizer == -(-lora_one.optimizer // 2) and lora_two.reference == 0


def _shape(model: Path) -> ModelShape:
    facts = inspect_model(model, "local")
    return ModelShape(
        facts.num_parameters, facts.hidden_size, facts.intermediate_size, facts.num_layers,
        facts.kv_dim, facts.vocab_size, facts.lora_targets,
    )  # fmt: skip
