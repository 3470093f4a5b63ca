"""Every job-spec knob reaches the step: std, aggregation, clipping, mu, beta = 0, schedule,
grad-norm clip, stop strings, truncation masking, and one temperature for sampling and scoring."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import workers.grpo.fast as fast_module
import workers.grpo.run as run_module
import workers.grpo.trainer as trainer_module
import workers.grpo.update as update_module
from tests.workers.grpo.helpers import FixedScorer, Recorder, small_spec
from workers.grpo.advantages import group_advantages
from workers.grpo.config import GenerationParams
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.sampling import PlainSampler
from workers.grpo.trainer import train


@pytest.fixture
def loss_calls(monkeypatch) -> list[dict]:
    """Records the arguments of every grpo_loss call of the trainer."""
    calls: list[dict] = []
    real = update_module.grpo_loss

    def spy(logprobs, old_logprobs, ref_logprobs, advantages, mask, **kw):
        calls.append(
            {"logprobs": logprobs.detach().clone(), "old": old_logprobs, "ref": ref_logprobs,
             "advantages": advantages, "mask": mask} | kw
        )  # fmt: skip
        return real(logprobs, old_logprobs, ref_logprobs, advantages, mask, **kw)

    monkeypatch.setattr(update_module, "grpo_loss", spy)
    return calls


@pytest.fixture
def captured(monkeypatch) -> dict:
    """The run's Policy and every step's Rollout."""
    seen: dict = {"rollouts": []}
    load, collect = run_module.load_policy, trainer_module.collect_rollout

    def load_policy(*a, **kw):
        seen["policy"] = load(*a, **kw)
        return seen["policy"]

    def collect_rollout(*a, **kw):
        seen["rollouts"].append(collect(*a, **kw))
        return seen["rollouts"][-1]

    monkeypatch.setattr(run_module, "load_policy", load_policy)
    monkeypatch.setattr(trainer_module, "collect_rollout", collect_rollout)
    return seen


REWARDS = [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0]  # two groups of 4


@pytest.mark.parametrize(
    ("std", "aggregation", "clip_high"),
    [
        ("population", "sequence_mean", None),
        ("sample", "token_mean", 0.28),
        ("none", "constant", 0.3),
    ],
)
def test_advantage_and_loss_knobs_reach_the_loss(
    tiny_model, digit_records, tmp_path, loss_calls, std, aggregation, clip_high
):
    spec = small_spec(
        tiny_model, std=std, loss_aggregation=aggregation, clip_epsilon=0.1,
        clip_epsilon_high=clip_high, beta=0.02,
    )  # fmt: skip
    hooks = Recorder()
    train(spec, digit_records, [FixedScorer(REWARDS)], tmp_path, hooks)
    expected = group_advantages(torch.tensor(REWARDS), 4, std)
    (call,) = loss_calls
    torch.testing.assert_close(call["advantages"], expected)
    assert call["aggregation"] == aggregation and call["beta"] == 0.02
    assert call["clip_epsilon"] == 0.1 and call["clip_epsilon_high"] == (clip_high or 0.1)
    assert hooks.metrics[1]["advantage_abs_mean"] == pytest.approx(expected.abs().mean().item())


def test_beta_zero_skips_the_reference_and_lr_follows_the_schedule(
    tiny_model, digit_records, digit_scorer, tmp_path, monkeypatch, captured
):
    forwards: list[float] = []  # the temperature of every log-prob forward pass

    def counting(*args, **kw):
        forwards.append(args[5] if len(args) > 5 else kw.get("temperature", 1.0))
        return real(*args, **kw)

    real = fast_module.completion_logprobs
    monkeypatch.setattr(fast_module, "completion_logprobs", counting)
    spec = small_spec(
        tiny_model, steps=4, beta=0.0, warmup_steps=2, lr_schedule="cosine",
        generation={"temperature": 0.7},
    )  # fmt: skip
    hooks = Recorder()
    train(spec, digit_records, [digit_scorer], tmp_path, hooks)
    assert captured["policy"].reference is None  # no frozen copy is even built
    assert forwards == [0.7] * 4  # one policy forward per step: no reference forward
    assert all(hooks.metrics[s]["kl"] == 0 for s in range(1, 5))
    lrs = [hooks.metrics[s]["learning_rate"] / 3e-3 for s in range(1, 5)]
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5])  # warm-up, then cosine to 0 at the end

    forwards.clear()
    hooks = Recorder()
    train(
        small_spec(tiny_model, beta=0.04, steps=2), digit_records, [digit_scorer], tmp_path, hooks
    )
    # beta > 0: step 1 the policy is still pi_ref (KL 0, no reference forward); step 2 reference
    # forward + policy forward, and a KL that is not 0
    assert len(forwards) == 3
    assert hooks.metrics[1]["kl"] == 0 and hooks.metrics[2]["kl"] > 0


def test_num_iterations_reuses_pi_old_and_ratios_move(
    tiny_model, digit_records, digit_scorer, tmp_path, loss_calls, captured
):
    spec = small_spec(
        tiny_model, num_iterations=2, learning_rate=2e-2, clip_epsilon=0.02, beta=0.0,
        micro_batch_size=4, max_new_tokens=6,
    )  # fmt: skip
    hooks = Recorder()
    train(spec, digit_records, [digit_scorer], tmp_path, hooks, device="cpu")
    assert len(loss_calls) == 4  # 2 passes x 2 micro-batches
    first, second = loss_calls[:2], loss_calls[2:]
    sampled = captured["rollouts"][0].generation.logprobs  # kept by the sampler: no forward
    assert sampled is not None and torch.equal(torch.cat([c["old"] for c in first]), sampled)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a["old"], b["old"])  # pi_old is kept from the sampling pass
        mask = a["mask"].bool()
        assert (a["logprobs"] - a["old"])[mask].abs().max() < 1e-5  # before the update: rho = 1
        assert (b["logprobs"] - b["old"])[mask].abs().max() > 1e-2  # after it: rho != 1
    assert hooks.metrics[1]["clip_ratio"] > 0


def test_max_grad_norm_clips_the_update(
    tiny_model, digit_records, digit_scorer, tmp_path, captured
):
    before = load_file(tiny_model / "model.safetensors")
    moved, norms = [], []
    for max_norm in (1.0, 1e-12):
        hooks = Recorder()
        spec = small_spec(tiny_model, max_grad_norm=max_norm)
        train(spec, digit_records, [digit_scorer], tmp_path / str(max_norm), hooks)
        after = captured["policy"].model.state_dict()
        moved.append(max((after[k] - v).abs().max().item() for k, v in before.items()))
        norms.append(hooks.metrics[1]["grad_norm"])
    assert norms[0] == pytest.approx(norms[1], rel=1e-5) and norms[0] > 1e-3  # pre-clip norm
    assert moved[0] > 1e-3 and moved[1] < 1e-2 * moved[0]  # Adam's eps swamps a tiny gradient


def test_stop_strings_and_truncated_completions_are_masked(
    tiny_model, digit_records, tmp_path, loss_calls, captured
):
    stops = list("abcdefghij")
    scorer = FixedScorer(REWARDS)
    spec = small_spec(
        tiny_model, mask_truncated_completions=True, generation={"stop": stops}, group_size=8
    )
    hooks = Recorder()
    train(spec, digit_records, [scorer], tmp_path, hooks)
    out = captured["rollouts"][0].generation
    stopped = [i for i, t in enumerate(scorer.seen[0]) if any(s in t["completion"] for s in stops)]
    assert stopped and out.truncated.any()  # the seed gives both kinds
    for i, sample in enumerate(scorer.seen[0]):
        text = sample["completion"]
        if i in stopped:  # cut right after the stop string; not truncated
            assert text[-1] in stops and not any(s in text[:-1] for s in stops)
            assert not out.truncated[i]
    (call,) = loss_calls
    keep = (~out.truncated).float().unsqueeze(1)  # (N, 1)
    torch.testing.assert_close(call["mask"], out.completion_mask * keep)
    assert hooks.metrics[1]["truncated_frac"] == pytest.approx(out.truncated.float().mean().item())


def test_sampling_and_scoring_use_the_same_temperature(tiny_model):
    """The empirical first-token distribution of the sampler at T matches exp(log-prob at T)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    head = model.lm_head.weight.detach() * 8.0  # untied from the embeddings
    model.lm_head.weight = torch.nn.Parameter(head)  # a peaked distribution, where T matters
    temperature, n = 0.6, 2000
    sampler = PlainSampler(model, tokenizer, torch.Generator().manual_seed(0))
    params = GenerationParams(max_new_tokens=1, temperature=temperature)
    out = sampler.generate(["Digit 3:"], n, params)
    tokens, counts = out.completion_ids[:, 0].unique(return_counts=True)
    freq = counts.float() / n
    args = (
        out.prompt_ids[:1],
        out.prompt_mask[:1],
        tokens.view(-1, 1)[:1],
        out.completion_mask[:1],
    )

    def probs(t: float) -> torch.Tensor:
        rows = tokens.numel()
        with torch.no_grad():
            lp, _ = completion_logprobs(
                model, args[0].expand(rows, -1), args[1].expand(rows, -1), tokens.view(-1, 1),
                torch.ones(rows, 1), t,
            )  # fmt: skip
        return lp.exp().squeeze(1)

    p = probs(temperature)
    tolerance = 4 * torch.sqrt(p * (1 - p) / n) + 2e-3
    assert ((freq - p).abs() <= tolerance).all(), (freq, p)
    assert p.sum() > 0.97  # the sampled tokens carry nearly all the mass
    wrong = probs(1.0)
    assert ((freq - wrong).abs() > tolerance).any()  # another temperature is told apart
    assert math.isfinite(p.log().sum().item())
