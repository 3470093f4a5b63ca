"""Packed micro-batches (`grpo.micro_batch_tokens`): the padded path's log-probs, loss and every
gradient, on full weights and on a LoRA adapter; `padding_fraction` of either layout."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from pydantic import ValidationError

from tests.workers.grpo.helpers import Recorder, small_spec
from workers.grpo.backend import ReferenceBackend
from workers.grpo.config import GRPOParams
from workers.grpo.fast import FastBackend
from workers.grpo.loss import loss_denominator
from workers.grpo.packing import first_fit_decreasing, pack_micro_batches
from workers.grpo.sampling import PlainSampler
from workers.grpo.trainer import train
from workers.grpo.update import accumulate_gradients, batch_logprobs

BUDGET = 40  # tokens per pack: the batch's 8 sequences (14-25 tokens) go in several


def test_first_fit_decreasing_fills_bins_within_the_budget() -> None:
    lengths = [7, 3, 9, 2, 5, 12, 1, 4]
    bins = first_fit_decreasing(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(8))  # every item exactly once
    assert [12] in [[lengths[i] for i in b] for b in bins]  # over the budget: alone
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins if len(b) > 1)
    assert len(bins) == 5  # 12 | 9+1 | 7+3 | 5+4 | 2: total 43 needs at least 5 bins of 10


@pytest.fixture(scope="module")
def batch(model_and_tokenizer):
    """8 completions of two prompts of different lengths, ended at different steps."""
    model, tokenizer = model_and_tokenizer
    sampler = PlainSampler(model, tokenizer, torch.Generator().manual_seed(3))
    params = small_spec("m", max_new_tokens=16).generation
    out = sampler.generate(["Digit 3:", "Say a digit, any one"], 4, params)
    assert len(set(out.lengths)) > 2 and len(set(out.prompt_mask.sum(1).tolist())) == 2
    return out


def _lora(model):
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(copy.deepcopy(model), config)


@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("backend", [ReferenceBackend(), FastBackend()], ids=["reference", "fast"])
def test_packed_loss_and_gradients_equal_the_padded_ones(
    model_and_tokenizer, batch, adapter, backend
) -> None:
    base = copy.deepcopy(model_and_tokenizer[0])
    model = _lora(base) if adapter else base
    out, gen = batch, small_spec("m", max_new_tokens=16).generation
    packs = pack_micro_batches(out, BUDGET)
    assert 1 < len(packs) < 8 and all(p.tokens <= BUDGET for p in packs)
    ref_lp = batch_logprobs(model, out, gen.temperature, None, backend=backend)
    packed_lp = batch_logprobs(
        model, out, gen.temperature, None, backend=backend, micro_batch_tokens=BUDGET
    )
    torch.testing.assert_close(packed_lp, ref_lp, rtol=0, atol=1e-5)
    with torch.no_grad():  # a policy away from pi_ref: KL, ratios and their gradients != 0
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 1e-2)
    advantages = torch.linspace(-1.5, 1.5, 8)
    mask = out.completion_mask
    runs = []
    for tokens in (None, BUDGET):
        g = GRPOParams(prompts_per_step=2, group_size=4, beta=0.04, micro_batch_tokens=tokens)
        denominator = loss_denominator(mask, g.loss_aggregation, gen.max_new_tokens)
        model.zero_grad(set_to_none=True)
        stats = accumulate_gradients(
            model, out, mask, advantages, ref_lp, ref_lp, g, gen, denominator, True,
            backend=backend,
        )  # fmt: skip
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        runs.append((stats, grads))
    (padded, padded_grads), (packed, packed_grads) = runs
    for key in ("loss", "policy_loss", "kl", "clip_ratio", "entropy"):
        torch.testing.assert_close(packed[key], padded[key], rtol=0, atol=1e-5)
    assert float(packed["kl"]) > 0 and any(v.abs().max() > 1e-4 for v in padded_grads.values())
    assert packed_grads.keys() == padded_grads.keys()
    assert not adapter or all("lora_" in name for name in packed_grads)  # the adapter's only
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=0, atol=1e-5)
    # padded: the batch's prompt width + the longest completion per row, less the real tokens
    real = float(out.prompt_mask.sum() + out.completion_mask.sum())
    positions = 8 * (out.prompt_ids.shape[1] + max(out.lengths))
    assert float(padded["padding_fraction"]) == pytest.approx(1 - real / positions)
    assert float(padded["padding_fraction"]) > 0.2 and float(packed["padding_fraction"]) == 0.0


def test_micro_batch_tokens_and_size_exclude_each_other() -> None:
    with pytest.raises(ValidationError, match="micro_batch_size or micro_batch_tokens"):
        GRPOParams(micro_batch_size=4, micro_batch_tokens=512)


def test_a_packed_run_trains_as_the_padded_one(tiny_model, digit_scorer, tmp_path):
    """Two steps (the second with pi_ref and a KL), packed in micro-batches of at most 40 tokens
    or padded: the same metrics, but no padding (the prompts' lengths differ)."""
    records = [
        {"prompt": "Digit 3:", "digit": 3},
        {"prompt": "Say the digit 7, say it:", "digit": 7},
    ]
    runs = []
    for tokens in (None, 40):
        spec = small_spec(tiny_model, steps=2, beta=0.04, max_new_tokens=12,
                          micro_batch_tokens=tokens)  # fmt: skip
        hooks = Recorder()
        train(spec, records, [digit_scorer], tmp_path / str(tokens), hooks)
        runs.append(hooks.metrics)
    padded, packed = runs
    for step in (1, 2):
        assert packed[step]["completion_len_mean"] == padded[step]["completion_len_mean"]
        for key in ("loss", "kl", "grad_norm", "entropy"):
            assert packed[step][key] == pytest.approx(padded[step][key], rel=1e-4, abs=1e-6)
        assert packed[step]["padding_fraction"] == 0.0 < padded[step]["padding_fraction"]
    assert packed[2]["kl"] > 0
