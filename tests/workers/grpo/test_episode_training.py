"""GRPO over episodes on the tiny model, each environment in the real sandboxed host.

The worked examples (docs/examples/environments/) are learnt in a short run; bad environments end
episodes, never the job; a resumed run replays its episodes from the step boundary.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from workers.environments import EnvironmentConfig, SandboxedEnvironment
from workers.grpo.config import TrainSpec
from workers.grpo.tiny_model import make_tiny_model
from workers.grpo.trainer import TrainHooks, train

EXAMPLES = Path(__file__).parents[3] / "docs" / "examples" / "environments"
EPISODE_METRICS = {
    "turns_mean", "tool_calls_mean", "tool_error_frac", "episode_len_mean", "reward_turn/1",
    "reward/environment", "errors/environment", "reward_mean", "loss", "entropy",
}  # fmt: skip


@pytest.fixture(scope="module")
def small_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("episode-training") / "tiny", hidden_size=64, layers=2,
        intermediate_size=128, chat_template=True,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: a model this small runs many tiny ops, which a second thread slows
    down on a loaded 2-core machine (the numbers are the same)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Recorder(TrainHooks):
    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.events: list[tuple[str, str, dict]] = []
        self.rows: list[dict] = []
        super().__init__(
            on_step=lambda step, m: self.metrics.__setitem__(step, m),
            on_event=lambda *event: self.events.append(event),
            on_rollouts=lambda _step, _split, rows: self.rows.extend(rows),
        )


def _spec(model: Path, name: str, steps: int, max_turns: int = 3, **extra) -> TrainSpec:
    return TrainSpec.model_validate({
        "base_model": str(model),
        "grpo": {"steps": steps, "prompts_per_step": 2, "group_size": 8, "learning_rate": 1e-2,
                 "warmup_steps": 3},
        "generation": {"max_new_tokens": 6},
        "checkpoint_every": 1000,
        "environment": {"name": name, "max_turns": max_turns},
    } | extra)  # fmt: skip


def _run(spec: TrainSpec, records: list[dict], source: str, work: Path, **kw) -> Recorder:
    hooks = Recorder()
    with SandboxedEnvironment(EnvironmentConfig(source=source)) as env:
        result = train(spec, records, [], work, hooks, environment=env, **kw)
    assert result.steps_completed == spec.grpo.steps
    return hooks


def _rise(hooks: Recorder) -> tuple[float, float]:
    rewards = [hooks.metrics[s]["reward_mean"] for s in sorted(hooks.metrics)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"reward first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    return first, last


def test_say_it_again_is_learnt(small_chat_model: Path, tmp_path: Path) -> None:
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in (3, 7)]
    source = (EXAMPLES / "say_it_again.py").read_text()
    hooks = _run(_spec(small_chat_model, "say_it_again", 20), records, source, tmp_path)
    first, last = _rise(hooks)
    assert last >= 0.5 and last >= 5 * first  # the reward is two turns' digit shares: max 2
    m = hooks.metrics[20]
    assert set(m) >= EPISODE_METRICS | {"reward_turn/2"}
    assert m["turns_mean"] == 2 and m["tool_calls_mean"] == 0 and m["errors/environment"] == 0
    assert m["reward_mean"] == pytest.approx(m["reward_turn/1"] + m["reward_turn/2"], abs=1e-5)
    row = hooks.rows[-1]
    assert [msg["role"] for msg in row["messages"]] == ["user", "assistant", "user", "assistant"]
    assert row["messages"][2]["content"] == "Say it again."
    assert row["completion"] == row["messages"][3]["content"]
    assert row["reward"] == pytest.approx(row["scores"]["turn/1"] + row["scores"]["turn/2"])


def test_calculator_tool_task_is_learnt(small_chat_model: Path, tmp_path: Path) -> None:
    records = [{"prompt": f"What is {a}+{b}?", "a": a, "b": b} for a, b in ((3, 4), (2, 3))]
    source = (EXAMPLES / "calculator.py").read_text()
    hooks = _run(_spec(small_chat_model, "calculator", 20), records, source, tmp_path)
    first, last = _rise(hooks)
    assert last >= 0.2 and last >= 5 * first
    assert set(hooks.metrics[20]) >= EPISODE_METRICS


BAD = """
def reset(record):
    if record["kind"] == "noreset":
        raise ValueError("no first turn")
    return record["prompt"]


def step(messages, record):
    kind = record["kind"]
    if kind == "boom":
        raise RuntimeError("the step failed")
    if kind == "loop":
        return {"observation": "more", "reward": 0.5, "done": False}
    if kind == "flood":
        return {"observation": "x" * 20000, "reward": 0.0, "done": False}
    if kind == "long":
        return {"observation": "y" * 1500, "reward": 0.0, "done": False}
    return {"observation": None, "reward": 1.0, "done": True}
"""


def test_a_bad_environment_ends_episodes_not_the_job(small_chat_model: Path, tmp_path) -> None:
    """A reset or a step that raises: that episode's error counted. Never done: cut at
    max_turns. An observation past the context (in characters, or in tokens): truncated, with
    an error."""
    kinds = ["boom", "loop", "flood", "long", "ok", "noreset"]
    records = [{"prompt": "Go:", "kind": k} for k in kinds]
    spec = _spec(small_chat_model, "bad", 2, max_turns=3)
    spec.grpo.prompts_per_step, spec.grpo.group_size = 6, 2
    hooks = _run(spec, records, BAD, tmp_path)
    rows = {kinds[r["record"]]: r for r in hooks.rows if r["step"] == 1}
    assert "the step failed" in rows["boom"]["errors"]["environment"]
    # one turn each: truncated exactly when it ran to max_new_tokens, as a single completion
    for one_turn in ("boom", "ok"):
        assert rows[one_turn]["truncated"] == (rows[one_turn]["length"] == 6), rows[one_turn]
        assert rows[one_turn]["finish_reason"] == (
            "length" if rows[one_turn]["truncated"] else "stop"
        )
    assert rows["loop"]["truncated"] and rows["loop"]["errors"] == {}
    assert [m["role"] for m in rows["loop"]["messages"]].count("assistant") == 3
    assert rows["loop"]["reward"] == pytest.approx(1.5)
    assert "past the context" in rows["flood"]["errors"]["environment"]
    assert "model's context of 1024 tokens" in rows["long"]["errors"]["environment"]
    assert rows["flood"]["truncated"] and rows["long"]["truncated"]
    assert rows["ok"]["reward"] == 1.0 and rows["ok"]["errors"] == {}
    assert "no first turn" in rows["noreset"]["errors"]["environment"]
    assert rows["noreset"]["messages"] == [] and rows["noreset"]["length"] == 0
    assert not rows["noreset"]["truncated"]  # no turn sampled: nothing was cut
    m = hooks.metrics[1]
    step_one = [r for r in hooks.rows if r["step"] == 1 and r["split"] == "train"]
    cut = sum(r["truncated"] for r in step_one)
    assert len(step_one) == 12 and cut >= 6  # loop, flood and long, with both episodes each
    assert m["errors/environment"] == 8 and m["truncated_frac"] == pytest.approx(cut / 12)
    events = [e for e in hooks.events if e[0] == "environment_errors"]
    assert len(events) == 2 and events[0][2]["count"] == 8


def test_resume_replays_episodes_from_the_step_boundary(small_chat_model, tmp_path) -> None:
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in (3, 7)]
    source = (EXAMPLES / "say_it_again.py").read_text()
    spec = _spec(small_chat_model, "say_it_again", 4, checkpoint_every=2)
    full = _run(spec, records, source, tmp_path / "a")
    step2 = tmp_path / "a" / "checkpoints" / "step-000002"
    resumed = _run(spec, records, source, tmp_path / "b", resume_from=step2)
    assert sorted(resumed.metrics) == [3, 4]
    for step in (3, 4):
        for key in ("reward_mean", "loss", "grad_norm", "episode_len_mean", "entropy"):
            assert resumed.metrics[step][key] == pytest.approx(full.metrics[step][key], abs=1e-6)


def test_held_out_evaluation_plays_episodes_of_the_environment(small_chat_model, tmp_path):
    """An environment job is evaluated on greedy episodes of the same environment: transcripts
    in the eval rollouts, episode metrics with an `eval_` prefix, the training unchanged."""
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in (3, 7)]
    held_out = [{"prompt": f"Digit {d}:", "digit": d} for d in (1, 5, 9)]
    source = (EXAMPLES / "say_it_again.py").read_text()
    spec = _spec(small_chat_model, "say_it_again", 3, eval_every=2)
    plain = _run(spec, records, source, tmp_path / "a")
    hooks = _run(spec, records, source, tmp_path / "b", eval_records=held_out)
    assert [s for s in (1, 2, 3) if "eval_reward_mean" in hooks.metrics[s]] == [2, 3]
    for s in (1, 2, 3):  # evaluation restores the sampler's random state
        assert hooks.metrics[s]["loss"] == plain.metrics[s]["loss"]
    m = hooks.metrics[3]
    assert m["eval_turns_mean"] == 2 and m["eval_tool_calls_mean"] == 0
    assert m["eval_errors/environment"] == 0 and "eval_episode_len_mean" in m
    assert m["eval_reward_mean"] == pytest.approx(m["eval_reward/environment"], abs=1e-6)
    assert m["eval_reward_mean"] == pytest.approx(
        m["eval_reward_turn/1"] + m["eval_reward_turn/2"], abs=1e-5
    )
    rows = [r for r in hooks.rows if r["split"] == "eval" and r["step"] == 3]
    assert [r["record"] for r in rows] == [0, 1, 2]
    for row, record in zip(rows, held_out, strict=True):
        roles = [msg["role"] for msg in row["messages"]]
        assert roles == ["user", "assistant", "user", "assistant"]
        assert row["messages"][0]["content"] == record["prompt"]
        assert row["messages"][2]["content"] == "Say it again."
        assert row["reward"] == pytest.approx(row["scores"]["turn/1"] + row["scores"]["turn/2"])
        assert row["length"] > 0 and row["completion"] == row["messages"][3]["content"]
    mean = sum(r["reward"] for r in rows) / len(rows)
    assert m["eval_reward_mean"] == pytest.approx(mean, abs=1e-5)
