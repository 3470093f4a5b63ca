"""The flat-reward warning: steps whose groups all scored alike are said once per streak."""

from __future__ import annotations

from tests.workers.grpo.helpers import FixedScorer, Recorder, small_spec
from workers.grpo.flat_rewards import FlatRewardWatch
from workers.grpo.trainer import train


def test_the_watch_fires_once_per_streak_of_three():
    watch = FlatRewardWatch()
    series = [1.0, 0.95, 0.9, 1.0, 1.0, 0.5, 1.0, 0.9, 0.89, 1.0, 1.0, 1.0]
    fired = [step for step, frac in enumerate(series, 1) if watch.observe(step, frac)]
    assert fired == [3, 12]  # not again at 4-5; 0.5 ends the streak; 0.89 ends the next one


def test_a_run_whose_rewards_are_all_equal_gets_exactly_one_warning(
    tiny_model, digit_records, tmp_path
):
    spec = small_spec(tiny_model, steps=5, max_new_tokens=2)
    hooks = Recorder()
    train(spec, digit_records, [FixedScorer([0.0])], tmp_path, hooks)
    assert [hooks.metrics[s]["frac_zero_std_groups"] for s in range(1, 6)] == [1.0] * 5
    warnings = [e for e in hooks.events if e[0] == "warning"]
    assert len(warnings) == 1, hooks.events
    _, message, data = warnings[0]
    assert data == {"reason": "flat_rewards", "step": 3, "steps": 3, "frac_zero_std_groups": 1.0}
    assert message.startswith("steps 1-3: 100% of the groups scored alike")


def test_rewards_that_differ_within_groups_raise_no_warning(tiny_model, digit_records, tmp_path):
    spec = small_spec(tiny_model, steps=4, max_new_tokens=2)
    hooks = Recorder()
    train(spec, digit_records, [FixedScorer([0.0, 1.0])], tmp_path, hooks)
    assert all(hooks.metrics[s]["frac_zero_std_groups"] == 0.0 for s in range(1, 5))
    assert not [e for e in hooks.events if e[0] == "warning"]
