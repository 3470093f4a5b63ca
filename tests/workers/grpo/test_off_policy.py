"""Off-policy steps (`grpo.max_off_policy_steps`): the TIS weights' maths, K = 0 as the
synchronous step, K >= 1 training on rollouts made ahead with the lag the schedule fixes, and a
resume that trains on the same prompts in the same order."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from tests.workers.grpo.helpers import Recorder, small_spec
from workers.grpo.config import TrainSpec
from workers.grpo.loss import grpo_loss, importance_weights
from workers.grpo.trainer import train
from workers.grpo.world import WorldSizeError, check_world

_TIMINGS = ("step_seconds", "tokens_per_second", "peak_memory_bytes")
_OFF_POLICY = ("off_policy_steps_mean", "is_weight_mean", "is_clipped_frac")


class RowsRecorder(Recorder):
    """Also keeps the dataset index of every trained completion's record, step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[int, list[int]] = {}
        self.on_rollouts = self._keep

    def _keep(self, step: int, split: str, rows: list[dict]) -> None:
        if split == "train":
            self.records[step] = [row["record"] for row in rows]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def test_importance_weights_are_the_ratio_truncated_at_the_cap():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))  # (1, 3) pi_old
    sampler = torch.log(torch.tensor([[0.5, 0.05, 0.6]]))  # (1, 3) pi_sampler
    weight, capped = importance_weights(old, sampler, cap=2.0)
    assert weight.tolist()[0] == pytest.approx([1.0, 2.0, 1.5])  # 0.2 / 0.05 = 4 -> 2
    assert capped.tolist() == [[False, True, False]]


def test_the_tis_weight_scales_each_tokens_policy_term_and_a_null_cap_is_off():
    torch.manual_seed(0)
    lp = torch.randn(2, 3, requires_grad=True)  # (N, T)
    sampler = lp.detach() + torch.tensor([[0.0, -2.0, 0.3], [0.1, 0.0, -0.2]])  # (N, T)
    adv, mask = torch.tensor([1.0, -0.5]), torch.ones(2, 3)
    knobs = dict(clip_epsilon=0.2, clip_epsilon_high=0.2, beta=0.0, aggregation="token_mean",
                 max_new_tokens=3)  # fmt: skip
    plain, _ = grpo_loss(lp, None, None, adv, mask, **knobs)
    off, _ = grpo_loss(lp, None, None, adv, mask, **knobs, sampler_logprobs=sampler)
    assert off.item() == plain.item()  # no cap: no correction
    loss, stats = grpo_loss(
        lp, None, None, adv, mask, **knobs, sampler_logprobs=sampler, importance_cap=2.0
    )
    w = torch.exp(lp.detach() - sampler).clamp(max=2.0)  # (N, T)
    # at ratio 1 (mu = 1) the per-token policy term is -A: the weighted mean is -sum(w A) / 6
    assert loss.item() == pytest.approx(-(w * adv.unsqueeze(1)).sum().item() / 6, rel=1e-6)
    assert stats["is_weight_mean"].item() == pytest.approx(w.mean().item())
    assert stats["is_clipped_frac"].item() == pytest.approx(1 / 6)  # exp(2) only


def test_k0_is_the_synchronous_step_whatever_the_cap(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    runs = []
    for cap in (2.0, None):
        spec = small_spec(tiny_model, steps=2, num_iterations=2, beta=0.04,
                          importance_sampling_cap=cap)  # fmt: skip
        assert spec.grpo.max_off_policy_steps == 0  # the default
        hooks = Recorder()
        result = train(spec, digit_records, [digit_scorer], tmp_path / str(cap), hooks)
        runs.append((hooks.metrics, _weights(result.final_checkpoint)))
    (m_a, w_a), (m_b, w_b) = runs
    for step in (1, 2):
        assert not set(_OFF_POLICY) & set(m_a[step])
        same = {k: v for k, v in m_a[step].items() if k not in _TIMINGS and "seconds" not in k}
        assert same == {k: m_b[step][k] for k in same}
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


@pytest.mark.parametrize(("k", "lora"), [(1, False), (2, False), (1, True)])
def test_rollouts_made_ahead_train_with_the_lag_of_the_schedule(
    k, lora, tiny_model, digit_records, digit_scorer, tmp_path
):
    extra = {"lora": {"r": 4, "alpha": 8}} if lora else {}
    spec = small_spec(tiny_model, steps=4, max_off_policy_steps=k, spec=extra)
    hooks = Recorder()
    result = train(spec, digit_records, [digit_scorer], tmp_path, hooks)
    lags = [hooks.metrics[s]["off_policy_steps_mean"] for s in range(1, 5)]
    assert lags == [min(k, s - 1) for s in range(1, 5)]  # batch s: the policy after s-1-K
    assert all(0 <= lag <= k for lag in lags)
    # lag 0: the sampler's weights are the trainer's, scored by the same maths
    assert hooks.metrics[1]["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert hooks.metrics[1]["is_clipped_frac"] == 0.0
    for m in hooks.metrics.values():
        assert all(math.isfinite(m[key]) for key in ("loss", "reward_mean", "grad_norm"))
        assert 0 < m["is_weight_mean"] <= 2.0 and 0 <= m["is_clipped_frac"] <= 1
    # the generator took the trainer's new weights (LoRA: the adapter): later batches differ
    assert any(hooks.metrics[s]["is_weight_mean"] != pytest.approx(1.0) for s in (2, 3, 4))
    if lora:  # B starts at 0: a trained adapter has some B != 0
        adapter = load_file(str(result.final_checkpoint / "adapter_model.safetensors"))
        assert any(t.abs().sum() > 0 for n, t in adapter.items() if "lora_B" in n)
        return
    start = _weights(tiny_model)
    trained = _weights(result.final_checkpoint)
    assert any(not torch.allclose(start[n], trained[n]) for n in start)


def test_a_resumed_run_trains_on_the_same_prompts_in_the_same_order(
    tiny_model, digit_scorer, tmp_path
):
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in range(7)]
    spec = small_spec(tiny_model, steps=4, max_off_policy_steps=1,
                      spec={"checkpoint_every": 2})  # fmt: skip
    straight = RowsRecorder()
    train(spec, records, [digit_scorer], tmp_path / "a", straight)
    # saved after step 2, when the generator had already drawn batch 3 (and maybe 4)
    step2 = tmp_path / "a" / "checkpoints" / "step-000002"
    resumed = RowsRecorder()
    train(spec, records, [digit_scorer], tmp_path / "b", resumed, resume_from=step2)
    assert sorted(resumed.records) == [3, 4]
    assert resumed.records == {s: straight.records[s] for s in (3, 4)}
    assert len({tuple(straight.records[s]) for s in range(1, 5)}) == 4  # no batch twice
    # the batch in flight at the checkpoint is sampled again, by the saved policy
    assert [resumed.metrics[s]["off_policy_steps_mean"] for s in (3, 4)] == [0.0, 1.0]


def test_off_policy_steps_are_bounded_and_run_on_one_process_without_episodes(tiny_model):
    with pytest.raises(ValidationError, match="max_off_policy_steps"):
        small_spec(tiny_model, max_off_policy_steps=9)
    with pytest.raises(ValidationError, match="importance_sampling_cap"):
        small_spec(tiny_model, importance_sampling_cap=0.5)
    with pytest.raises(WorldSizeError, match="max_off_policy_steps"):
        check_world(small_spec(tiny_model, prompts_per_step=2, max_off_policy_steps=1), 2)
    with pytest.raises(ValidationError, match="environment"):
        TrainSpec.model_validate(
            {
                "base_model": "m",
                "grpo": {"max_off_policy_steps": 1},
                "environment": {"name": "e"},
            }  # fmt: skip
        )


def test_the_generators_error_is_raised_by_train_and_its_thread_ends(
    tiny_model, digit_scorer, tmp_path
):
    import threading

    spec = small_spec(tiny_model, steps=2, max_off_policy_steps=1)
    with pytest.raises(KeyError, match="prompt"):  # a record without its prompt
        train(spec, [{"digit": 3}], [digit_scorer], tmp_path, Recorder())
    assert not [t for t in threading.enumerate() if t.name == "grpo-rollouts"]


def test_a_rollout_device_trains_as_the_shared_generator(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    """`rollout_devices` 1: the generator samples from a whole copy of the model on the next
    device (on a CPU the CPU), its batches handed over through `moved`; the run's metrics are
    those of the generator that shares the trainer's frozen tensors."""
    spec = small_spec(tiny_model, steps=3, max_off_policy_steps=1)
    runs = []
    for devices in (0, 1):
        hooks = Recorder()
        train(spec, digit_records, [digit_scorer], tmp_path / str(devices), hooks,
              rollout_devices=devices)  # fmt: skip
        runs.append(hooks.metrics)
    shared, own = runs
    for step in (1, 2, 3):
        for key in ("loss", "reward_mean", "is_weight_mean", "off_policy_steps_mean"):
            assert own[step][key] == pytest.approx(shared[step][key], abs=1e-6), (step, key)
    with pytest.raises(ValueError, match="max_off_policy_steps"):
        train(small_spec(tiny_model, steps=1), digit_records, [digit_scorer], tmp_path / "x",
              Recorder(), rollout_devices=1)  # fmt: skip


def test_a_batch_made_on_another_device_is_moved_whole():
    from workers.grpo.off_policy import moved
    from workers.grpo.rollout import Rollout
    from workers.grpo.sampling import Generation

    ids = torch.ones(2, 3, dtype=torch.long)
    gen = Generation(ids, ids, ids, ids.float(), ["a", "b"], torch.zeros(2, dtype=torch.bool))
    records = [{"prompt": "p"}, {"prompt": "q"}]
    roll = Rollout(records, gen, torch.ones(2), torch.ones(2), {"m": 1.0})
    out = moved(roll, torch.device("meta"))
    assert out is not roll and out.generation is not gen
    assert out.records is records  # no tensor inside: the same records (known by identity)
    assert out.generation.completion_ids.device.type == "meta"
    assert out.rewards.device.type == "meta" and out.generation.texts == ["a", "b"]
    assert roll.rewards.device.type == "cpu"  # the original is left as it was


def test_a_lora_generator_shares_the_frozen_base_and_takes_the_adapter_alone():
    from peft import LoraConfig, get_peft_model

    from tests.workers.grpo.helpers import small_lm
    from workers.grpo.off_policy import generator_copy

    model = get_peft_model(small_lm("llama"), LoraConfig(r=4, target_modules="all-linear"))
    twin = generator_copy(model)
    pairs = list(zip(model.parameters(), twin.parameters(), strict=True))
    assert all((a is b) != a.requires_grad for a, b in pairs)  # frozen: shared; adapter: own
    trained = [b for a, b in pairs if a.requires_grad]
    assert trained and all("lora_" in n for n, p in twin.named_parameters() if p.requires_grad)
    whole = generator_copy(model, "cpu")  # a rollout device: nothing shared
    assert not any(a is b for a, b in zip(model.parameters(), whole.parameters(), strict=True))
