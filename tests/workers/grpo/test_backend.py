"""The fast backend is pinned to the reference one: same completions for the same seed, the
same log-probs and gradients up to float rounding, the same training run; `GRPO_ENGINE`
chooses between them."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.grpo.helpers import Recorder, small_lm, small_spec
from workers.grpo.backend import ReferenceBackend, select_backend
from workers.grpo.config import GenerationParams
from workers.grpo.fast import FastBackend
from workers.grpo.trainer import train

PROMPTS = ["Digit 7:", "Say a digit, any one"]


def _gelu_model(tiny_model):
    """The tiny model with GELU MLPs: outside the lean forward, the fast path's own-forward."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.config.hidden_act = "gelu"
    for layer in model.model.layers:
        layer.mlp.act_fn = torch.nn.GELU()
    return model


@pytest.fixture(params=["lean", "own-forward"])
def model(request, model_and_tokenizer, tiny_model):
    return model_and_tokenizer[0] if request.param == "lean" else _gelu_model(tiny_model).eval()


def _generate(backend, model, tokenizer, **params):
    sampler = backend.sampler(model, tokenizer, torch.Generator().manual_seed(5))
    gen = GenerationParams(max_new_tokens=24, temperature=0.9, top_k=30, top_p=0.95, **params)
    return sampler.generate(PROMPTS, 4, gen, keep_logprobs=True)


@pytest.mark.parametrize("stop", [[], ["a", "b"]])
def test_same_seed_same_completions(model, model_and_tokenizer, stop) -> None:
    tokenizer = model_and_tokenizer[1]
    ref = _generate(ReferenceBackend(), model, tokenizer, stop=stop)
    fast = _generate(FastBackend(record=True), model, tokenizer, stop=stop)
    assert fast.texts == ref.texts and fast.lengths == ref.lengths
    assert torch.equal(fast.completion_ids, ref.completion_ids)
    assert torch.equal(fast.completion_mask, ref.completion_mask)
    assert torch.equal(fast.truncated, ref.truncated)
    assert len(set(ref.lengths)) > 1  # rows ended at different steps: some were retired
    torch.testing.assert_close(fast.logprobs, ref.logprobs, atol=2e-5, rtol=0)


def _forward(backend, model, out, temperature: float):
    """Log-probs, entropy and the gradient of a weighted sum of the log-probs."""
    model.zero_grad(set_to_none=True)
    rows, cols = slice(0, out.completion_ids.shape[0]), slice(0, max(out.lengths))
    lp, entropy = backend.forward(model, out, rows, cols, temperature, True)
    weights = torch.linspace(-1, 1, lp.numel()).view_as(lp)
    (lp * weights).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    with torch.inference_mode():
        scored = backend.logprobs(model, out, rows, cols, temperature)
    return lp.detach(), entropy, grads, scored


@pytest.mark.parametrize("replay", [True, False])
def test_log_probs_and_gradients_match(model, model_and_tokenizer, replay) -> None:
    """Scoring and the training forward, the fast one replaying the decode's matmuls or not."""
    model = copy.deepcopy(model)
    tokenizer = model_and_tokenizer[1]
    out = _generate(FastBackend(record=replay), model, tokenizer)
    assert (out.backend_state is not None) == (replay and model.config.hidden_act == "silu")
    mask = out.completion_mask[:, : max(out.lengths)].bool()
    ref = _forward(ReferenceBackend(), model, copy.copy(out), 0.9)
    fast = _forward(FastBackend(), model, out, 0.9)
    assert out.backend_state is None  # used up by the training forward
    for a, b in zip(fast[:2] + fast[3:], ref[:2] + ref[3:], strict=True):
        torch.testing.assert_close(a[mask], b[mask], atol=2e-5, rtol=0)
    torch.testing.assert_close(ref[1][~mask], torch.zeros_like(ref[1][~mask]))
    assert fast[2].keys() == ref[2].keys()
    for name, grad in ref[2].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(fast[2][name], grad, atol=1e-5 * max(scale, 1), rtol=1e-4)


def test_grpo_engine_chooses_the_backend(monkeypatch, tiny_model) -> None:
    model = small_lm("llama")
    monkeypatch.delenv("GRPO_ENGINE", raising=False)
    assert select_backend(model).name == "fast"
    monkeypatch.setenv("GRPO_ENGINE", "reference")
    assert select_backend(model).name == "reference"
    monkeypatch.setenv("GRPO_ENGINE", "fast")
    assert select_backend(model).name == "fast"
    assert select_backend(object()).name == "reference"  # not a transformers model
    monkeypatch.setenv("GRPO_ENGINE", "turbo")
    with pytest.raises(ValueError, match="GRPO_ENGINE"):
        select_backend(model)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_training_with_either_engine_gives_the_same_run(
    monkeypatch, tiny_model, digit_records, digit_scorer, tmp_path, beta
) -> None:
    """Three steps on the tiny model: the same completions (same rewards and lengths) and the
    same loss, KL and gradient norm up to rounding, step after step."""
    spec = small_spec(tiny_model, steps=3, beta=beta, max_new_tokens=12)
    runs = {}
    for engine in ("reference", "fast"):
        monkeypatch.setenv("GRPO_ENGINE", engine)
        hooks = Recorder()
        train(spec, digit_records, [digit_scorer], tmp_path / engine, hooks)
        runs[engine] = hooks.metrics
    ref, fast = runs["reference"], runs["fast"]
    assert ref.keys() == fast.keys() == {1, 2, 3}
    for step in ref:
        for key in ("reward_mean", "completion_len_mean", "truncated_frac"):
            assert fast[step][key] == ref[step][key], (step, key)
        for key in ("loss", "kl", "grad_norm", "entropy", "clip_ratio_high"):
            assert fast[step][key] == pytest.approx(ref[step][key], rel=1e-3, abs=1e-6), (step, key)
