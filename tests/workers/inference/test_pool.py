"""The serving pool's least-recently-used eviction (issue 18 item 1): base models beyond
`max_models`, and LoRA adapters beyond `max_adapters` on one base, swapped without reloading
the base; what an evicted model or adapter answers when it comes back is what it answered
before. Real weights: the tiny model and adapters saved by peft."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from workers.inference.params import ModelRef
from workers.inference.pool import ModelPool

IDS = torch.tensor([[5, 6, 7, 8]])


def logits(pool: ModelPool, ref: ModelRef) -> torch.Tensor:
    with pool.use(ref) as (model, _), torch.no_grad():
        return model(IDS).logits[0, -1].clone()


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three different LoRA adapters of the tiny model (non-zero B: each changes the output)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = []
    for seed in range(3):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        config = LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", init_lora_weights=False)
        path = tmp_path_factory.mktemp(f"adapter{seed}")
        get_peft_model(model, config).save_pretrained(path)
        out.append(str(path))
    return out


def test_bases_beyond_max_models_are_evicted_least_recent_first(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    a, b = ModelRef(str(tiny_model_dir), label="a"), ModelRef(str(copy), label="b")
    pool = ModelPool(max_models=1, max_adapters=2, device="cpu")
    first = logits(pool, a)
    logits(pool, b)
    assert [w for w, _ in pool.bases] == [str(copy)]
    assert (pool.stats.base_loads, pool.stats.base_evictions) == (2, 1)
    assert torch.equal(logits(pool, a), first)  # loaded again, the same weights
    assert (pool.stats.base_loads, pool.stats.base_evictions) == (3, 2)

    two = ModelPool(max_models=2, max_adapters=2, device="cpu")
    logits(two, a), logits(two, b), logits(two, a)  # a is the most recent: b goes first
    logits(two, ModelRef(str(shutil.copytree(tiny_model_dir, tmp_path / "third"))))
    assert [w for w, _ in two.bases] == [str(tiny_model_dir), str(tmp_path / "third")]


def test_adapters_beyond_max_adapters_are_evicted_on_one_base(
    tiny_model_dir: Path, adapters: list[str]
) -> None:
    pool = ModelPool(max_models=1, max_adapters=2, device="cpu")
    base = ModelRef(str(tiny_model_dir))
    refs = [
        ModelRef(str(tiny_model_dir), adapter=a, label=f"ckpt{i}") for i, a in enumerate(adapters)
    ]
    plain = logits(pool, base)
    outs = [logits(pool, r) for r in refs]  # the third evicts the first
    assert all(not torch.allclose(o, plain) for o in outs)  # each adapter is in use
    assert not torch.allclose(outs[0], outs[1])
    assert (pool.stats.adapter_loads, pool.stats.adapter_evictions) == (3, 1)
    assert len(next(iter(pool.bases.values())).adapters) == 2
    assert torch.equal(logits(pool, base), plain)  # adapters disabled for the base
    assert torch.allclose(logits(pool, refs[0]), outs[0])  # back, as it answered before
    assert (pool.stats.adapter_loads, pool.stats.adapter_evictions) == (4, 2)
    assert torch.allclose(logits(pool, refs[2]), outs[2])  # still loaded: not reloaded
    assert pool.stats.adapter_loads == 4
    assert (pool.stats.base_loads, pool.stats.base_evictions) == (1, 0)  # one base throughout
