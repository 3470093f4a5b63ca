"""Precision and memory knobs of a run: bf16 (autocast forward passes, fp32 master weights and
optimizer state, a bf16 frozen reference), final checkpoints in the base model's own dtype,
and gradient checkpointing giving the same step as keeping the activations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.workers.grpo.helpers import FixedScorer, Recorder, small_spec
from workers.grpo.device import autocast_for, resolve_precision
from workers.grpo.policy import load_policy
from workers.grpo.tiny_model import make_tiny_model
from workers.grpo.trainer import train

RECORDS = [{"prompt": f"Digit {d}:"} for d in range(4)]


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model saved in bf16, as most Hub models are."""
    return make_tiny_model(tmp_path_factory.mktemp("bf16") / "m", dtype="bfloat16")


def _tensor_dtypes(directory: Path) -> set[torch.dtype]:
    (weights,) = directory.glob("*.safetensors")
    with safe_open(weights, "pt") as fh:
        return {fh.get_slice(k).get_dtype() for k in fh.keys()}  # noqa: SIM118


def _run(spec_model: Path, tmp_path: Path, **spec: object) -> tuple[Recorder, Path]:
    recorder = Recorder()
    s = small_spec(spec_model, steps=2, spec={"checkpoint_every": 1, **spec})
    train(s, RECORDS, [FixedScorer([0.0, 1.0])], tmp_path, recorder)
    return recorder, tmp_path / "checkpoints"


@pytest.mark.parametrize("lora", [None, {"r": 4}])
def test_the_final_checkpoint_is_in_the_base_models_dtype(
    bf16_model: Path, tmp_path: Path, lora: dict | None
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, checkpoints = _run(bf16_model, tmp_path, lora=lora)
    periodic, final = checkpoints / "step-000001", checkpoints / "step-000002"
    assert _tensor_dtypes(periodic) == {"F32"}  # resumable: the fp32 master weights, exactly
    assert _tensor_dtypes(final) == {"BF16"}
    if lora is None:
        assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
        loaded = AutoModelForCausalLM.from_pretrained(final)
    else:
        base = AutoModelForCausalLM.from_pretrained(bf16_model)
        loaded = PeftModel.from_pretrained(base, final)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    size = sum(f.stat().st_size for f in final.glob("*.safetensors"))
    periodic_size = sum(f.stat().st_size for f in periodic.glob("*.safetensors"))
    assert size < 0.55 * periodic_size


def test_an_fp32_base_keeps_fp32_checkpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    _, checkpoints = _run(tiny_model_dir, tmp_path)
    assert _tensor_dtypes(checkpoints / "step-000002") == {"F32"}


def test_bf16_keeps_fp32_master_weights_and_a_bf16_reference(tiny_model_dir: Path) -> None:
    spec = small_spec(tiny_model_dir, beta=0.04)
    policy = load_policy(spec, "cpu", precision="bf16")
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    assert policy.reference is not None
    assert {p.dtype for p in policy.reference.parameters()} == {torch.bfloat16}
    with autocast_for("cpu", "bf16")():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    with autocast_for("cpu", "fp32")():
        assert not torch.is_autocast_enabled("cpu")


def test_precision_defaults_to_the_device(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_precision(None, "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    recorder, _ = _run(tiny_model_dir, tmp_path, precision="bf16")
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in recorder.metrics.values())
    assert recorder.metrics[2]["grad_norm"] > 0


def test_gradient_checkpointing_gives_the_same_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    kept, _ = _run(tiny_model_dir, tmp_path / "kept")
    recomputed, _ = _run(tiny_model_dir, tmp_path / "recomputed", gradient_checkpointing=True)
    for step in (1, 2):
        for key in ("loss", "kl", "grad_norm", "reward_mean"):
            assert recomputed.metrics[step][key] == pytest.approx(
                kept.metrics[step][key], rel=1e-4, abs=1e-6
            ), (step, key)
