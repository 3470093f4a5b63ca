"""load_pretrained: CPU numbers as plain fp32 transformers loading gives them, frozen or
trained, the pad token set where the tokenizer has none, saved adapters merged in order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.models import lora
from workers.models.loading import ModelLoadError, ensure_pad_token, load_pretrained

IDS = torch.tensor([[5, 6, 7, 8, 9]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_cpu_weights_are_fp32_and_bit_identical(tiny_model_dir: Path) -> None:
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for frozen in (True, False):
        loaded = load_pretrained(tiny_model_dir, "cpu", frozen=frozen)
        assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
        assert all(p.requires_grad != frozen for p in loaded.model.parameters())
        assert loaded.model.training is False
        assert torch.equal(_logits(loaded.model), _logits(plain))
        assert loaded.stored_dtype == torch.float32


def test_column_major_only_when_asked(tiny_model_dir: Path) -> None:
    rows = load_pretrained(tiny_model_dir, "cpu", frozen=True).model
    cols = load_pretrained(tiny_model_dir, "cpu", frozen=True, column_major=True).model
    name = "model.layers.0.self_attn.q_proj.weight"
    assert dict(rows.named_parameters())[name].is_contiguous()
    assert dict(cols.named_parameters())[name].t().is_contiguous()
    # the same values: only the BLAS's order of summation may differ
    assert torch.allclose(_logits(rows), _logits(cols), atol=1e-5)


def test_dtype_override(tiny_model_dir: Path) -> None:
    model = load_pretrained(tiny_model_dir, "cpu", frozen=True, dtype=torch.bfloat16).model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_pad_token_is_eos_where_the_tokenizer_has_none(
    no_pad_model_dir: Path, tiny_model_dir: Path
) -> None:
    tokenizer = load_pretrained(no_pad_model_dir, "cpu", frozen=True).tokenizer
    assert tokenizer.pad_token == tokenizer.eos_token == "<eos>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    kept = load_pretrained(tiny_model_dir, "cpu", frozen=True).tokenizer
    assert kept.pad_token == "<pad>"  # a tokenizer's own pad token is kept
    assert ensure_pad_token(AutoTokenizer.from_pretrained(tiny_model_dir)).pad_token == "<pad>"


def test_a_load_failure_names_the_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="cannot load base_model 'x'"):
        load_pretrained(tmp_path / "missing", "cpu", frozen=True, label="base_model 'x'")


def _saved_adapter(base: Path, path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = lora.add_lora(model, lora.lora_config(2, 4, "all-linear"))
    with torch.no_grad():  # B is zero at init: a non-zero B makes the adapter change outputs
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    lora.save_adapter(peft, "default", path)
    return path


def test_merged_chain_is_the_adapters_in_order(tiny_model_dir: Path, tmp_path: Path) -> None:
    a = _saved_adapter(tiny_model_dir, tmp_path / "a", 1)
    b = _saved_adapter(tiny_model_dir, tmp_path / "b", 2)
    merged = load_pretrained(tiny_model_dir, "cpu", frozen=False, merge=[a, b]).model
    assert all(p.requires_grad for p in merged.parameters())  # trained: not peft's frozen base
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    by_hand = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    by_hand = lora.load_adapter(by_hand, a).merge_and_unload()
    by_hand = lora.load_adapter(by_hand, b)  # the last one unmerged: the same function
    plain = load_pretrained(tiny_model_dir, "cpu", frozen=True).model
    assert torch.allclose(_logits(merged), _logits(by_hand), atol=1e-5)
    assert not torch.allclose(_logits(merged), _logits(plain), atol=1e-3)
