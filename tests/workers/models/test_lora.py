"""LoRA from the caller's rank, alpha, targets and dropout; saved adapters round-trip exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.models import lora
from workers.models.loading import load_pretrained

IDS = torch.tensor([[5, 6, 7, 8, 9]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_built_with_the_callers_numbers(tiny_model_dir: Path) -> None:
    base = load_pretrained(tiny_model_dir, "cpu", frozen=False).model
    linear = {n: m for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)}
    config = lora.lora_config(3, 7.0, ["q_proj", "down_proj"], dropout=0.25)
    model = lora.add_lora(base, config, name="run")
    got = model.peft_config["run"]
    assert (got.r, got.lora_alpha, got.lora_dropout) == (3, 7.0, 0.25)
    assert set(got.target_modules) == {"q_proj", "down_proj"}
    assert got.task_type == "CAUSAL_LM"

    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    targeted = [n for n in linear if n.endswith(("q_proj", "down_proj"))]
    assert len(trainable) == 2 * len(targeted)  # lora_A and lora_B of each, the base frozen
    for name in targeted:
        a = trainable[f"base_model.model.{name}.lora_A.run.weight"]
        b = trainable[f"base_model.model.{name}.lora_B.run.weight"]
        assert a.shape == (3, linear[name].in_features)
        assert b.shape == (linear[name].out_features, 3)
        assert not b.any()  # B starts at zero: the new adapter changes nothing yet
    dropout = model.base_model.model.model.layers[0].self_attn.q_proj.lora_dropout["run"]
    assert dropout.p == 0.25
    assert model.base_model.model.model.layers[0].self_attn.q_proj.scaling["run"] == 7.0 / 3


def test_save_load_round_trip_gives_identical_logits(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = load_pretrained(tiny_model_dir, "cpu", frozen=True).model
    model = lora.add_lora(base, lora.lora_config(4, 8, "all-linear"), name="one")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    want = _logits(model)
    lora.save_adapter(model, "one", tmp_path / "one")
    assert (tmp_path / "one" / "adapter_model.safetensors").is_file()

    fresh = load_pretrained(tiny_model_dir, "cpu", frozen=True).model
    assert not torch.equal(_logits(fresh), want)
    loaded = lora.load_adapter(fresh, tmp_path / "one", name="one")
    assert torch.equal(_logits(loaded), want)
    assert not any(p.requires_grad for p in loaded.parameters())  # served: not trainable

    # a second adapter on the same peft model, by name; the first one unchanged
    lora.save_adapter(model, "one", tmp_path / "two")
    both = lora.load_adapter(loaded, tmp_path / "two", name="two")
    both.set_adapter("two")
    assert torch.equal(_logits(both), want)
    assert set(both.peft_config) == {"one", "two"}
    state = lora.adapter_state(both, "one")
    assert state.keys() == lora.adapter_state(model, "one").keys()


def test_trainable_load_and_state_that_does_not_fit(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = load_pretrained(tiny_model_dir, "cpu", frozen=False).model
    model = lora.add_lora(base, lora.lora_config(2, 4, ["q_proj"]))
    lora.save_adapter(model, "default", tmp_path / "a")
    again = load_pretrained(tiny_model_dir, "cpu", frozen=False).model
    resumed = lora.load_adapter(again, tmp_path / "a", trainable=True)
    assert {n for n, p in resumed.named_parameters() if p.requires_grad} == {
        n for n, p in model.named_parameters() if p.requires_grad
    }
    other = lora.add_lora(load_pretrained(tiny_model_dir, "cpu", frozen=True).model,
                          lora.lora_config(2, 4, ["v_proj"]))  # fmt: skip
    with pytest.raises(ValueError, match="do not fit"):
        lora.load_adapter_state(other, "default", lora.adapter_state(model, "default"))


def test_linear_layers_groups_and_the_tied_unembedding(tiny_model_dir: Path) -> None:
    groups = lora.linear_layers(load_pretrained(tiny_model_dir, "cpu", frozen=True).model)
    assert groups["lm_head"] == "tied"  # the tiny model ties it to the embedding
    assert groups["model.layers.0.self_attn.q_proj"] == "attn"
    assert groups["model.layers.0.mlp.up_proj"] == "mlp"
