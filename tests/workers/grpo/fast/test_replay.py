"""The training forward replays the decode loop's matmuls (`workers.grpo.fast.replay`).

The replayed forward must give the fresh forward's log-probs and gradients (Llama with MHA,
Qwen2 with GQA and q/k/v biases, Qwen3 with q/k norms; CPU weight layout as the trainer uses),
must really skip the completion positions' matmuls, and must be refused once the weights have
changed. In a training run, replay changes the metrics by float rounding only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.workers.grpo.helpers import LLAMA_FAMILY, small_lm
from workers.grpo import trainer
from workers.grpo.config import GenerationParams, TrainSpec
from workers.grpo.device import use_cpu_weight_layout
from workers.grpo.fast import replay, sampling
from workers.grpo.fast.lean_forward import fed_index
from workers.grpo.fast.logprobs import completion_logprobs
from workers.grpo.fast.replay import Replay
from workers.grpo.fast.sampling import FastSampler

PROMPTS = ["Digit 7:", "Say a digit, any one"]


def _model(name: str, vocab: int, eos: int, column_major: bool):
    torch.manual_seed(0)
    model = small_lm(name, vocab_size=vocab, eos_token_id=eos)
    use_cpu_weight_layout(model, column_major)
    return model


def _sample(model, tokenizer, temperature: float = 1.0):
    sampler = FastSampler(model, tokenizer, torch.Generator().manual_seed(0), record=True)
    # stop strings: rows end at different steps and are fed pads from then on
    params = GenerationParams(max_new_tokens=10, temperature=temperature, stop=list("abcdefgh"))
    return sampler.generate(PROMPTS, 4, params)


def _logprobs_and_grads(model, out, tape, temperature: float):
    model.zero_grad(set_to_none=True)
    t = out.completion_ids.shape[1]
    with FlopCounterMode(display=False) as flops:
        lp, _ = completion_logprobs(
            model,
            out.prompt_ids,
            out.prompt_mask,
            out.completion_ids,
            out.completion_mask,
            temperature,
            tape=tape,
        )
    weights = torch.linspace(-1, 1, lp.numel()).view_as(lp) * out.completion_mask
    (lp * weights).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    assert lp.shape[1] == t
    return lp.detach(), grads, flops.get_total_flops()


@pytest.mark.parametrize("name", LLAMA_FAMILY)
@pytest.mark.parametrize("column_major", [True, False])
@pytest.mark.parametrize("retire", [True, False])
def test_replayed_forward_gives_the_fresh_forward(
    monkeypatch, tiny_model: Path, name: str, column_major: bool, retire: bool
) -> None:
    """Also where the decode loop dropped rows as they ended (`retire`: at every end)."""
    monkeypatch.setattr(sampling, "RETIRE_AT", 0.99 if retire else 0.0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = _model(name, len(tokenizer), tokenizer.eos_token_id, column_major)
    out = _sample(model, tokenizer, temperature=0.7)
    assert out.backend_state is not None and out.backend_state.usable_by(model)
    assert bool(out.backend_state.rows) == retire  # steps that decoded only some rows
    t = out.completion_ids.shape[1]
    lengths = out.completion_mask.sum(1)
    assert t > 2 and lengths.min() < lengths.max()  # rows ended at different steps

    fresh, fresh_grads, fresh_flops = _logprobs_and_grads(model, out, None, 0.7)
    tape = Replay(out.backend_state, slice(None), t - 1, release=True)
    replayed, replayed_grads, replayed_flops = _logprobs_and_grads(model, out, tape, 0.7)

    valid = out.completion_mask.bool()
    torch.testing.assert_close(replayed[valid], fresh[valid], atol=1e-5, rtol=0)
    for k, g in fresh_grads.items():
        torch.testing.assert_close(replayed_grads[k], g, atol=1e-5, rtol=1e-4, msg=k)
        assert replayed_grads[k].stride() == model.get_parameter(k).stride()
    # exactly the fed completion positions' matmuls (a completion's first L - 1 positions,
    # K rounded up) were not run again: only prompts and the LM head were
    index = fed_index(lengths.long().tolist(), t - 1, torch.device("cpu"))
    fed = len(out.texts) * (t - 1) if index is None else len(index)
    assert fed < 0.9 * len(out.texts) * (t - 1)  # fewer than all positions
    per_row = 2 * sum(
        p.numel() for k, p in model.named_parameters() if ".layers." in k and p.dim() == 2
    )
    assert fresh_flops - replayed_flops == fed * per_row
    assert out.backend_state.outputs == {}  # released as the forward consumed it


@pytest.mark.parametrize("merged", [True, False])
def test_a_lora_model_replays_its_merged_decode(
    monkeypatch, tiny_model: Path, merged: bool
) -> None:
    """LoRA (peft, all linear layers, B trained away from 0): the decode loop ran on weights
    with the updates merged in (`merged`; else the base weights and the updates factored, as
    without packing); the replayed forward gives the fresh forward's log-probs and A / B
    gradients, without the base maps' products on the completion positions (forward, and
    weight gradients: the base is frozen)."""
    from peft import LoraConfig, get_peft_model

    from workers.grpo.fast import lean_decode

    if not merged:  # the decode loop's weights neither fused nor packed: factored updates
        real = lean_decode.LeanDecoder.__init__
        monkeypatch.setattr(
            lean_decode.LeanDecoder,
            "__init__",
            lambda self, model, fuse=None, pack=None, rows=16: real(
                self, model, False, False, rows
            ),
        )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    base = _model("qwen2", len(tokenizer), tokenizer.eos_token_id, column_major=False)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    out = _sample(model.eval(), tokenizer)
    assert out.backend_state is not None and out.backend_state.lora_merged == merged
    t = out.completion_ids.shape[1]
    results = []
    for tape in (None, Replay(out.backend_state, slice(None), t - 1, release=True)):
        model.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as flops:
            lp, _ = completion_logprobs(
                model, out.prompt_ids, out.prompt_mask, out.completion_ids,
                out.completion_mask, tape=tape,
            )  # fmt: skip
        (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp) * out.completion_mask).sum().backward()
        grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
        results.append((lp.detach(), grads, flops.get_total_flops()))
    (fresh, fresh_grads, fresh_flops), (replayed, replayed_grads, replayed_flops) = results
    valid = out.completion_mask.bool()
    torch.testing.assert_close(replayed[valid], fresh[valid], atol=1e-5, rtol=0)
    assert replayed_grads.keys() == fresh_grads.keys()
    assert all("lora_" in k for k in fresh_grads) and len(fresh_grads) == 2 * 7 * 2
    for k, g in fresh_grads.items():
        torch.testing.assert_close(replayed_grads[k], g, atol=1e-5, rtol=1e-4, msg=k)
    assert replayed_flops < 0.7 * fresh_flops


def test_a_window_of_rows_replays_its_rows(tiny_model: Path) -> None:
    """Rows 2-5 (a micro-batch across the two groups) replay what a fresh forward computes."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = _model("llama", len(tokenizer), tokenizer.eos_token_id, column_major=False)
    out = _sample(model, tokenizer)
    rows, t = slice(2, 6), out.completion_ids.shape[1]
    args = (out.prompt_ids[rows], out.prompt_mask[rows])
    args += (out.completion_ids[rows], out.completion_mask[rows])
    fresh, _ = completion_logprobs(model, *args)
    replayed, _ = completion_logprobs(
        model, *args, tape=Replay(out.backend_state, rows, t - 1, release=False)
    )
    valid = out.completion_mask[rows].bool()
    torch.testing.assert_close(replayed[valid], fresh[valid], atol=1e-5, rtol=0)


def test_one_token_completions_have_nothing_to_replay(tiny_model: Path) -> None:
    """One-token completions: the decode loop ran no step, the forward computes every row."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = _model("qwen2", len(tokenizer), tokenizer.eos_token_id, column_major=False)
    sampler = FastSampler(model, tokenizer, torch.Generator().manual_seed(0), record=True)
    params = GenerationParams(max_new_tokens=1)
    out = sampler.generate(PROMPTS, 4, params)
    args = (out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    fresh, _ = completion_logprobs(model, *args)
    replayed, _ = completion_logprobs(
        model, *args, tape=Replay(out.backend_state, slice(None), 0, release=True)
    )
    torch.testing.assert_close(replayed, fresh, atol=1e-6, rtol=0)


def test_replay_is_refused_when_the_weights_changed(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    other = AutoModelForCausalLM.from_pretrained(tiny_model)
    out = _sample(model, tokenizer)
    assert out.backend_state.usable_by(model) and not out.backend_state.usable_by(other)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.add_(0.0)  # an optimizer step does this
    assert not out.backend_state.usable_by(model)
    with pytest.raises(ValueError, match="positions asked"):
        Replay(out.backend_state, slice(None), out.completion_ids.shape[1] + 1, release=False)


def test_a_training_run_with_replay_matches_one_without(tiny_model: Path, tmp_path: Path) -> None:
    """Same seed, replay on and off (refused via its guard): the same metrics up to rounding."""

    class Digit:
        name, weight = "digit", 1.0

        def score(self, samples):
            return [s["completion"].count("7") / 8 for s in samples], [None] * len(samples)

    spec = TrainSpec(
        base_model=str(tiny_model),
        grpo={"steps": 3, "prompts_per_step": 2, "group_size": 4, "beta": 0.04, "seed": 3},
        generation={"max_new_tokens": 8},
        checkpoint_every=10**6,
    )
    records = [{"prompt": f"Digit {d}:"} for d in range(8)]

    def run(allow: bool, directory: Path) -> list[dict]:
        steps, replays = [], []
        usable = replay.DecodeRecord.usable_by

        def guarded(self, model):
            replays.append(allow and usable(self, model))
            return replays[-1]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(replay.DecodeRecord, "usable_by", guarded)
            hooks = trainer.TrainHooks(on_step=lambda _s, m: steps.append(m))
            trainer.train(spec, records, [Digit()], directory, hooks)
        assert replays == [allow] * 3
        return steps

    with_replay, without = run(True, tmp_path / "a"), run(False, tmp_path / "b")
    for a, b in zip(with_replay, without, strict=True):
        assert a["reward_mean"] == b["reward_mean"]  # same completions: same seeds, same weights
        for key in ("loss", "kl", "grad_norm", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-6), key


def test_replay_under_bf16_autocast_keeps_the_autocast_dtype(tiny_model: Path) -> None:
    """As on CUDA: decode and training forward under bf16 autocast (here the CPU's)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = _model("qwen2", len(tokenizer), tokenizer.eos_token_id, column_major=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _sample(model, tokenizer)
        record = out.backend_state
        assert all(y.dtype == torch.bfloat16 for ys in record.outputs.values() for y in ys)
        t = out.completion_ids.shape[1]
        fresh, fresh_grads, _ = _logprobs_and_grads(model, out, None, 1.0)
        tape = Replay(record, slice(None), t - 1, release=True)
        replayed, replayed_grads, _ = _logprobs_and_grads(model, out, tape, 1.0)
    valid = out.completion_mask.bool()
    torch.testing.assert_close(replayed[valid], fresh[valid], atol=5e-2, rtol=0)
    for k, g in fresh_grads.items():
        assert replayed_grads[k].dtype == torch.float32  # the fp32 master weights' gradient
        cosine = torch.nn.functional.cosine_similarity(replayed_grads[k].flatten(), g.flatten(), 0)
        assert cosine > 0.99, k
