"""GRPO's policy, the serving pool and the Tinker host all load through `load_pretrained`:
the loader's dtype rule and pad token are what each of them ends up with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.workers.grpo.helpers import small_spec
from workers.grpo.policy import load_policy
from workers.inference.params import ModelRef
from workers.inference.pool import ModelPool
from workers.models import loading
from workers.tinker.host import LoraHost
from workers.tinker.types import LoraConfig


def _pool_model(path: Path) -> tuple[torch.nn.Module, object]:
    pool = ModelPool(max_models=1, max_adapters=1, device="cpu")
    with pool.use(ModelRef(str(path), label="m")) as (model, tokenizer):
        return model, tokenizer


def _models(path: Path, tmp_path: Path) -> dict[str, tuple[torch.nn.Module, object]]:
    policy = load_policy(small_spec(path), "cpu")
    host = LoraHost(path, device="cpu", state_dir=tmp_path / "state")
    return {
        "policy": (policy.model, policy.tokenizer),
        "pool": _pool_model(path),
        "tinker": (host.model, host.tokenizer),
    }


def test_every_caller_gets_the_loaders_pad_token(no_pad_model_dir: Path, tmp_path: Path) -> None:
    for name, (_, tokenizer) in _models(no_pad_model_dir, tmp_path).items():
        assert tokenizer.pad_token_id == tokenizer.eos_token_id, name


def test_every_caller_gets_the_loaders_dtype_rule(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule no caller would pick itself (float64 frozen, float16 trained) reaches each."""
    roles = []

    def rule(device: str, *, frozen: bool, precision: str | None = None) -> torch.dtype:
        roles.append(frozen)
        return torch.float64 if frozen else torch.float16

    monkeypatch.setattr(loading, "weights_dtype", rule)
    models = _models(tiny_model_dir, tmp_path)
    assert sorted(roles) == [False, True, True]  # the policy trains; serving and Tinker's base not
    assert {p.dtype for p in models["policy"][0].parameters()} == {torch.float16}
    for name in ("pool", "tinker"):
        model = models[name][0]
        assert {p.dtype for p in model.parameters()} == {torch.float64}, name
        assert not any(p.requires_grad for p in model.parameters()), name


def test_on_cpu_every_caller_is_fp32_and_tinker_adapters_train(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    models = _models(tiny_model_dir, tmp_path)
    for name, (model, _) in models.items():
        assert {p.dtype for p in model.parameters()} == {torch.float32}, name
    host = LoraHost(tiny_model_dir, device="cpu", state_dir=tmp_path / "again")
    host.create_run("r", LoraConfig(rank=4))
    params = host.adapters.parameters(host._runs["r"].name)
    assert params and all(p.requires_grad and p.dtype == torch.float32 for p in params)


def test_tinker_adapters_stay_fp32_on_a_bf16_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    """What a GPU gets by default (a bf16 base), asked for on CPU: every run's adapter fp32."""
    from tests.workers.tinker.conftest import sft_datum

    host = LoraHost(tiny_model_dir, device="cpu", state_dir=tmp_path / "s", dtype="bfloat16")
    base = [p for n, p in host.model.named_parameters() if "lora_" not in n]
    for run in ("a", "b"):  # the first wraps the base (get_peft_model), the next are added
        host.create_run(run, LoraConfig(rank=4))
        params = host.adapters.parameters(host._runs[run].name)
        assert {p.dtype for p in params} == {torch.float32}
        out = host.forward_backward(run, [sft_datum(host.tokenizer, "hello")], "cross_entropy")
        assert all(p.grad is not None for p in params)
        assert out.metrics["loss:sum"] > 0
    assert {p.dtype for p in base} == {torch.bfloat16}
