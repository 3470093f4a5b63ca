"""Held-out evaluation every `eval_every` steps, and the reward-hacking alarm."""

from __future__ import annotations

import pytest

from tests.workers.grpo.helpers import DriftScorer, Recorder, small_spec
from workers.grpo.evaluation import HackingWatch, reward_hacking_suspected, slope
from workers.grpo.trainer import train


def test_slope_is_least_squares():
    assert slope([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert slope([0.0, 1.0, 0.0]) == pytest.approx(0.0)
    assert slope([5.0]) == 0.0


@pytest.mark.parametrize(
    ("train", "held_out", "suspected"),
    [
        ([0.1, 0.2, 0.4], [0.8, 0.6, 0.5], True),  # the classic picture
        ([0.0, 0.0, 0.1, 0.2, 0.4], [0.0, 0.9, 0.8, 0.6, 0.5], True),  # only the window counts
        ([0.1, 0.2, 0.4], [0.5, 0.6, 0.8], False),  # both rise: learning
        ([0.4, 0.2, 0.1], [0.8, 0.6, 0.5], False),  # both fall: collapse, not hacking
        ([0.1, 0.2, 0.4], [0.500, 0.495, 0.490], False),  # held-out flat within the margin
        ([0.1, 0.2], [0.8, 0.6], False),  # too few eval points
    ],
)
def test_detector_on_synthetic_series(train, held_out, suspected):
    assert reward_hacking_suspected(train, held_out) is suspected


def test_watch_fires_once_per_episode_and_round_trips():
    watch = HackingWatch()
    fired = []
    series = [(0.1, 0.9), (0.2, 0.8), (0.3, 0.7), (0.4, 0.6), (0.4, 0.9), (0.5, 1.0), (0.6, 0.5)]
    for i, (train_reward, eval_reward) in enumerate(series):
        watch.observe_step(train_reward - 0.05)
        watch.observe_step(train_reward + 0.05)  # the mean of the steps since the last eval
        if watch.observe_eval(eval_reward) is not None:
            fired.append(i)
    assert fired == [2, 6]  # not again at 3; re-armed once held-out reward recovered
    assert watch.train == pytest.approx([t for t, _ in series])
    copy = HackingWatch()
    copy.load_state_dict(watch.state_dict())
    assert copy == watch


def test_trainer_evaluates_and_raises_the_alarm(tiny_model, digit_records, tmp_path):
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in range(5)]
    gamed = DriftScorer("length", start=0.1, delta=0.1)  # training reward rises every step
    truth = DriftScorer("digit", start=0.9, delta=-0.1)  # held-out reward falls every eval
    spec = small_spec(tiny_model, steps=4, group_size=2, prompts_per_step=1, max_new_tokens=2,
                      spec={"eval_every": 1})  # fmt: skip
    hooks = Recorder()
    train(spec, digit_records, [gamed], tmp_path, hooks, eval_records=records, eval_scorers=[truth])
    assert [hooks.metrics[s]["eval_reward_mean"] for s in (1, 2, 3, 4)] == pytest.approx(
        [0.9, 0.8, 0.7, 0.6]
    )
    assert hooks.metrics[2]["eval_reward/digit"] == pytest.approx(0.8)
    assert hooks.metrics[2]["eval_errors/digit"] == 0
    alarms = [e for e in hooks.events if e[0] == "reward_hacking_suspected"]
    assert len(alarms) == 1  # at the third eval point, not repeated at the fourth
    _, message, data = alarms[0]
    assert data["step"] == 3 and data["train_slope"] > 0 > data["eval_slope"]
    assert "held-out reward fell" in message


def test_eval_cadence_and_no_effect_on_training(tiny_model, digit_records, digit_scorer, tmp_path):
    spec = small_spec(tiny_model, steps=3, spec={"eval_every": 2}, max_new_tokens=3)
    plain, evaluated = Recorder(), Recorder()
    train(spec, digit_records, [digit_scorer], tmp_path / "a", plain)
    train(
        spec, digit_records, [digit_scorer], tmp_path / "b", evaluated, eval_records=digit_records
    )
    assert [s for s in (1, 2, 3) if "eval_reward_mean" in evaluated.metrics[s]] == [2, 3]
    assert "eval_reward/digit" in evaluated.metrics[3]  # eval_scorers default to the scorers
    assert not any("eval_reward_mean" in m for m in plain.metrics.values())
    for s in (1, 2, 3):  # evaluation restores the sampler's random state
        assert evaluated.metrics[s]["loss"] == plain.metrics[s]["loss"]
        assert evaluated.metrics[s]["reward_mean"] == plain.metrics[s]["reward_mean"]


class OffByOneScorer:
    """A gameable verifier: an off-by-one answer key credits the digit after the one asked for.
    The policy can collect its reward while getting every answer wrong."""

    name, weight = "off_by_one", 1.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        scores: list[float | None] = []
        for s in samples:
            wrong, text = str((s["digit"] + 1) % 10), s["completion"]
            scores.append(text.count(wrong) / len(text) if text else 0.0)
        return scores, [None] * len(samples)


def test_a_gamed_verifier_raises_the_alarm_in_a_real_run(tiny_model, digit_scorer, tmp_path):
    """A few steps on the digit task (held-out correctness 0.65), then training on a verifier
    the policy games: its reward climbs while held-out correctness falls, and the trainer says so
    with the `reward_hacking_suspected` event. Nothing here is scripted: real sampling, scoring
    and updates on the tiny model (seeded, CPU)."""
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in (2, 5)]
    # seed 1: a run whose draws (`sampling.row_noise`) show the drift within these few steps
    learn = small_spec(tiny_model, steps=8, prompts_per_step=4, group_size=8, beta=0.04,
                       max_new_tokens=8, seed=1)  # fmt: skip
    learned = train(learn, records, [digit_scorer], tmp_path / "learn", Recorder())
    gamed = small_spec(learned.final_checkpoint, steps=12, prompts_per_step=4, group_size=8,
                       beta=0.0, max_new_tokens=8, spec={"eval_every": 2}, seed=1)  # fmt: skip
    hooks = Recorder()
    train(gamed, records, [OffByOneScorer()], tmp_path / "gamed", hooks, eval_records=records,
          eval_scorers=[digit_scorer])  # fmt: skip
    train_reward = [hooks.metrics[s]["reward/off_by_one"] for s in range(1, 13)]
    held_out = [hooks.metrics[s]["eval_reward/digit"] for s in range(2, 13, 2)]
    assert sum(train_reward[-3:]) / 3 > sum(train_reward[:3]) / 3 + 0.2, train_reward
    assert held_out[-1] < held_out[0] - 0.2, held_out
    alarms = [e for e in hooks.events if e[0] == "reward_hacking_suspected"]
    assert len(alarms) == 1, (train_reward, held_out)
    _, message, data = alarms[0]
    assert data["train_slope"] > 0 > data["eval_slope"] and "held-out reward fell" in message
