"""Dynamic sampling (DAPO): flat groups are replaced by fresh prompts, up to a limit."""

from __future__ import annotations

import torch

from tests.workers.grpo.helpers import Recorder, small_spec
from workers.grpo.config import GenerationParams, GRPOParams
from workers.grpo.rollout import collect_rollout, flat_groups, merge_generations
from workers.grpo.sampling import Generation
from workers.grpo.trainer import train

PAD = 0


class FakeSampler:
    """Prompt k of a call gets a prompt of k+1 tokens and completions of k+2 tokens."""

    def generate(self, prompts, group_size, params, keep_logprobs=False) -> Generation:
        rows = [(p, j) for p in prompts for j in range(group_size)]
        width_p, width_c = len(prompts) + 1, len(prompts) + 2
        prompt_ids = torch.full((len(rows), width_p), PAD)
        prompt_mask = torch.zeros(len(rows), width_p, dtype=torch.long)
        completion_ids = torch.full((len(rows), width_c), PAD)
        completion_mask = torch.zeros(len(rows), width_c)
        for i, (p, _) in enumerate(rows):
            k = prompts.index(p)
            prompt_ids[i, width_p - k - 1 :], prompt_mask[i, width_p - k - 1 :] = 7, 1
            completion_ids[i, : k + 2], completion_mask[i, : k + 2] = 9, 1.0
        texts = [f"{p}/{j}" for p, j in rows]
        return Generation(
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            texts,
            torch.zeros(len(rows), dtype=torch.bool),
            -completion_mask * (1 + torch.arange(len(rows)))[:, None] if keep_logprobs else None,
            group_size=group_size,
        )


class FlatOrSpread:
    """Records named 'flat*' score 1 on every completion, others j % 2 (a spread)."""

    name, weight = "fs", 1.0

    def score(self, samples):
        scores = [
            1.0 if s["prompt"].startswith("flat") else float(int(s["completion"][-1]) % 2)
            for s in samples
        ]
        return scores, [None] * len(samples)


def _draw(names):
    queue = [{"prompt": n} for n in names]
    return lambda k: [queue.pop(0) for _ in range(k)]


def _rollout(names, rounds, num_iterations=1):
    grpo = GRPOParams(
        prompts_per_step=3, group_size=2, skip_zero_std_groups=True, max_resample_rounds=rounds,
        num_iterations=num_iterations,
    )  # fmt: skip
    return collect_rollout(
        _draw(names),
        FakeSampler(),
        [FlatOrSpread()],
        grpo,
        GenerationParams(),
        PAD,
        lambda *e: None,
    )


def test_flat_groups_are_refilled_until_none_is_left():
    names = ["flat-a", "spread-a", "flat-b", "flat-c", "spread-b", "spread-c"]
    roll = _rollout(names, rounds=4)
    assert [r["prompt"] for r in roll.records] == ["spread-b", "spread-a", "spread-c"]
    assert roll.metrics["resampled_groups"] == 3  # round 1 drew 2, round 2 drew 1
    assert flat_groups(roll.rewards, 2) == []
    assert roll.first_rewards.tolist() == [1, 1, 0, 1, 1, 1]  # the metrics' rewards: 1st draw
    out = roll.generation
    assert out.texts == [
        "spread-b/0",
        "spread-b/1",
        "spread-a/0",
        "spread-a/1",
        "spread-c/0",
        "spread-c/1",
    ]
    # re-padded to the widest prompt (left) and completion (right), tokens kept
    assert out.prompt_ids.shape == (6, 4) and out.completion_ids.shape == (6, 5)
    assert out.prompt_mask.sum(1).tolist() == [2, 2, 2, 2, 1, 1]
    assert out.completion_mask.sum(1).tolist() == [3, 3, 3, 3, 2, 2]
    assert (out.prompt_ids[out.prompt_mask == 0] == PAD).all()
    assert (out.completion_ids[out.completion_mask == 0] == PAD).all()
    assert (out.prompt_mask[:, -1] == 1).all()  # left padding: prompts end at the right edge
    assert out.group_size == 2  # whole groups, in order


def test_kept_logprobs_follow_their_rows_through_the_refill():
    """num_iterations > 1: the sampler keeps pi_old; refilled rows bring theirs along."""
    names = ["flat-a", "spread-a", "flat-b", "flat-c", "spread-b", "spread-c"]
    out = _rollout(names, rounds=4, num_iterations=2).generation
    assert out.logprobs is not None and out.logprobs.shape == out.completion_mask.shape
    assert torch.equal(out.logprobs != 0, out.completion_mask == 1)
    # FakeSampler: row i of a call has log-prob -(i + 1); spread-a was rows 2-3 of the first
    # call, spread-b rows 2-3 of the second, spread-c rows 0-1 of the third
    per_row = out.logprobs.sum(1) / out.completion_mask.sum(1)
    assert per_row.tolist() == [-3, -4, -3, -4, -1, -2]
    assert _rollout(names, rounds=4).generation.logprobs is None  # mu = 1: none kept


def test_the_limit_leaves_flat_groups_in_place():
    roll = _rollout(["flat-a", "spread-a", "flat-b", "flat-c", "flat-d"], rounds=1)
    assert [r["prompt"] for r in roll.records] == ["flat-a", "spread-a", "flat-b"]
    assert roll.metrics["resampled_groups"] == 2
    assert flat_groups(roll.rewards, 2) == [0, 2]


def test_off_by_default_and_the_batch_is_untouched():
    grpo = GRPOParams(prompts_per_step=2, group_size=2)
    sampler = FakeSampler()
    roll = collect_rollout(
        _draw(["flat-a", "spread-a"]),
        sampler,
        [FlatOrSpread()],
        grpo,
        GenerationParams(),
        PAD,
        lambda *e: None,
    )
    assert roll.metrics["resampled_groups"] == 0 and roll.rewards.tolist() == [1, 1, 0, 1]
    assert torch.equal(roll.rewards, roll.first_rewards)


def test_merge_keeps_one_generation_as_is():
    out = FakeSampler().generate(["a", "b"], 2, GenerationParams())
    assert merge_generations([out], [(0, i) for i in range(4)], PAD) is out


class FlatByRecord:
    """Every completion of a record with flat=True scores 1; others score by text length."""

    name, weight = "fr", 1.0

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score(self, samples):
        self.calls.append(len(samples))
        return [
            1.0 if s["flat"] else float(len(s["completion"])) + 0.1 * i
            for i, s in enumerate(samples)
        ], [None] * len(samples)


def test_trainer_reports_resampled_groups(tiny_model, tmp_path):
    records = [{"prompt": f"Digit {d}:", "flat": d % 2 == 0} for d in range(8)]
    scorer = FlatByRecord()
    spec = small_spec(tiny_model, steps=2, skip_zero_std_groups=True, max_resample_rounds=3)
    hooks = Recorder()
    train(spec, records, [scorer], tmp_path, hooks)
    drawn = sum(scorer.calls) // 4  # prompts scored, 4 completions each
    resampled = sum(hooks.metrics[s]["resampled_groups"] for s in (1, 2))
    assert resampled > 0 and drawn == 2 * 2 + resampled
    for step in (1, 2):
        m = hooks.metrics[step]
        assert m["frac_zero_std_groups"] > 0 or m["resampled_groups"] == 0  # first draw's stat
        assert m["advantage_abs_mean"] > 0


def test_zero_rounds_draws_nothing():
    roll = _rollout(["flat-a", "flat-b", "flat-c"], rounds=0)
    assert roll.metrics["resampled_groups"] == 0 and len(roll.records) == 3
