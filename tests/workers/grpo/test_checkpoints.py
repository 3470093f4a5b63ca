"""What checkpoints hold and how many stay: the final one is the model alone (no optimizer
state), periodic ones resume, and `keep_checkpoints` prunes the local copies as TRL's
save_total_limit does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.workers.grpo.helpers import Recorder, small_spec
from workers.grpo.checkpoint import TRAINER_STATE, NotResumable
from workers.grpo.config import TrainSpec
from workers.grpo.trainer import train


def _dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "checkpoints").iterdir())


def test_final_checkpoint_is_the_model_alone_and_loads(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    spec = small_spec(tiny_model, steps=2, spec={"checkpoint_every": 1})
    hooks = Recorder()
    result = train(spec, digit_records, [digit_scorer], tmp_path, hooks)
    (_, periodic), (_, final) = hooks.checkpoints
    assert result.final_checkpoint == final
    assert (periodic / TRAINER_STATE).is_file()  # resumable
    assert not (final / TRAINER_STATE).exists()
    assert {p.name for p in final.iterdir()} >= {"model.safetensors", "tokenizer.json", "spec.json"}
    assert TrainSpec.model_validate_json((final / "spec.json").read_text()) == spec
    model = AutoModelForCausalLM.from_pretrained(final)
    saved = load_file(final / "model.safetensors")
    for name, tensor in model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name


def test_lora_final_checkpoint_is_the_adapter_alone_and_loads_with_peft(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    from peft import PeftModel

    lora = {"r": 4, "export_merged": True}
    spec = small_spec(tiny_model, steps=2, spec={"checkpoint_every": 1, "lora": lora})
    hooks = Recorder()
    train(spec, digit_records, [digit_scorer], tmp_path, hooks)
    (_, periodic), (_, final) = hooks.checkpoints
    assert (periodic / TRAINER_STATE).is_file()
    assert not (final / TRAINER_STATE).exists()
    assert (final / "adapter_model.safetensors").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    adapter = load_file(final / "adapter_model.safetensors")
    model = PeftModel.from_pretrained(base, final)
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(adapter) > 0
    AutoModelForCausalLM.from_pretrained(final / "merged")


def test_resuming_from_a_final_checkpoint_is_refused_before_loading(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    spec = small_spec(tiny_model, steps=1)
    final = train(spec, digit_records, [digit_scorer], tmp_path / "a", Recorder()).final_checkpoint
    more = small_spec(tiny_model, steps=3)
    with pytest.raises(NotResumable, match=f"no {TRAINER_STATE} .*periodic checkpoint"):
        train(more, digit_records, [digit_scorer], tmp_path / "b", Recorder(), resume_from=final)


def test_the_kept_periodic_checkpoint_resumes_exactly(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    spec = small_spec(tiny_model, steps=3, spec={"checkpoint_every": 1, "keep_checkpoints": 1})
    full = Recorder()
    train(spec, digit_records, [digit_scorer], tmp_path / "a", full)
    assert _dirs(tmp_path / "a") == ["step-000002", "step-000003"]
    resumed = Recorder()
    step2 = tmp_path / "a" / "checkpoints" / "step-000002"
    train(spec, digit_records, [digit_scorer], tmp_path / "b", resumed, resume_from=step2)
    assert sorted(resumed.metrics) == [3]
    for key in ("reward_mean", "loss", "kl", "grad_norm"):
        assert resumed.metrics[3][key] == pytest.approx(full.metrics[3][key], abs=1e-6), key


def test_keep_checkpoints_keeps_the_newest_n_and_the_final(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    spec = small_spec(tiny_model, steps=5, spec={"checkpoint_every": 1, "keep_checkpoints": 2})
    seen: list[list[str]] = []
    hooks = Recorder()
    on_checkpoint = hooks.on_checkpoint

    def record(step: int, path: Path) -> None:
        on_checkpoint(step, path)
        seen.append(_dirs(tmp_path))  # the hook still finds the new one in place

    hooks.on_checkpoint = record
    train(spec, digit_records, [digit_scorer], tmp_path, hooks)
    assert [s for s, _ in hooks.checkpoints] == [1, 2, 3, 4, 5]
    assert seen[2] == ["step-000001", "step-000002", "step-000003"]  # pruned after the hook
    assert _dirs(tmp_path) == ["step-000003", "step-000004", "step-000005"]


def test_keep_checkpoints_null_keeps_every_checkpoint(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    spec = small_spec(tiny_model, steps=3, spec={"checkpoint_every": 1, "keep_checkpoints": None})
    assert spec == small_spec(tiny_model, steps=3, spec={"checkpoint_every": 1})  # the default
    train(spec, digit_records, [digit_scorer], tmp_path, Recorder())
    assert _dirs(tmp_path) == ["step-000001", "step-000002", "step-000003"]


@pytest.mark.parametrize("value", [0, -1, 10_001, 1.5])
def test_keep_checkpoints_is_validated(tiny_model, value):
    with pytest.raises(ValidationError, match="keep_checkpoints"):
        small_spec(tiny_model, spec={"keep_checkpoints": value})
    assert small_spec(tiny_model, spec={"keep_checkpoints": 10_000}).keep_checkpoints == 10_000
