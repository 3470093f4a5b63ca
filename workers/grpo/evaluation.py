"""Held-out evaluation (GRPO step 8) and the reward-hacking alarm.

Every `eval_every` steps and at the last step, the current policy completes the first
`EVAL_MAX_PROMPTS` held-out records (a fixed subset, so eval points are comparable), one greedy
completion per prompt (top-k = 1, the job's `max_new_tokens` and stop strings, the sampler's
random state restored afterwards so evaluation never changes the training trajectory). The
eval verifiers score them: `eval_reward_mean`, `eval_reward/<name>`, `eval_errors/<name>`.
A job with an environment is evaluated as it trains: one greedy episode per held-out record,
played through the same environment session (`episode_rollout.py`), its reward the episode's
(step rewards plus the eval verifiers on the final transcript), with the episode metrics
(`eval_turns_mean`, `eval_tool_calls_mean`, `eval_tool_error_frac`, `eval_episode_len_mean`,
`eval_reward_turn/<k>`, `eval_reward/environment`, `eval_errors/environment`).

Reward hacking: group-normalised advantages amplify any exploitable verifier, so the training
reward can rise while what it stands for falls. At each eval point the watch records the mean
training reward since the previous eval point and the held-out reward. It raises the alarm when,
over the last `window` = 3 eval points, the least-squares slope of the training reward is above
`+margin` and that of the held-out reward below `-margin` (margin 0.01 reward units per eval
interval), once per episode: it re-arms when the condition no longer holds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from workers.grpo.config import GenerationParams
from workers.grpo.distributed import without_weights
from workers.grpo.sampling import Generation, Sampler
from workers.grpo.scoring import Scored, Scorer, score_batch

if TYPE_CHECKING:
    from workers.grpo.episode_rollout import EpisodeRollout, Played

EVAL_MAX_PROMPTS = 64
HACKING_WINDOW = 3
HACKING_MARGIN = 0.01


def evaluate(
    sampler: Sampler,
    generator: torch.Generator,
    records: list[dict],
    scorers: Sequence[Scorer],
    gen: GenerationParams,
    on_event: Callable[[str, str, dict], None],
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    on_batch: Callable[[list[dict], Generation, Scored, Played | None], None] | None = None,
    episodes: EpisodeRollout | None = None,
) -> dict[str, float]:
    """Greedy completions (with `episodes`: episodes) of the held-out records, scored: the
    `eval_*` metrics of a step. `on_batch` gets the records, their completions, scores and,
    for episodes, the transcripts and turn rewards (the eval rollouts)."""
    t0 = time.perf_counter()
    records = records[:EVAL_MAX_PROMPTS]
    greedy = gen.model_copy(update={"top_k": 1})
    state = generator.get_state()
    played: Played | None = None
    try:
        with context():
            if episodes is None:
                out = sampler.generate([r["prompt"] for r in records], 1, greedy)
            else:
                out, scored, played = episodes.play(
                    records, sampler, scorers, 1, greedy, False, on_event
                )
    finally:
        generator.set_state(state)
    if played is None:
        scored = score_batch(scorers, records, out.texts, 1, on_event)  # rewards (n,)
    scored.metrics.pop("completion_tokens", None)  # episodes: counted below, by the model mask
    if on_batch is not None:
        on_batch(records, out, scored, played)
    # every process evaluates every record: nothing to weight across them
    metrics = {f"eval_{k}": v for k, v in without_weights(scored.metrics).items()}
    metrics["eval_reward_mean"] = scored.rewards.mean().item()
    sampled = out.sampled_mask  # (n, T) the model's own tokens (episodes: every turn's)
    metrics["eval_completion_len_mean"] = sampled.sum(1).float().mean().item()
    metrics["eval_completion_tokens"] = sampled.sum().item()
    metrics["eval_seconds"] = time.perf_counter() - t0
    return metrics


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of values against 0, 1, 2, ..."""
    n = len(values)
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    num = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(values))
    den = sum((i - x_mean) ** 2 for i in range(n))
    return num / den if den else 0.0


def reward_hacking_suspected(
    train: Sequence[float],
    held_out: Sequence[float],
    window: int = HACKING_WINDOW,
    margin: float = HACKING_MARGIN,
) -> bool:
    """Training reward rising and held-out reward falling over the last `window` eval points."""
    if len(train) < window or len(held_out) < window:
        return False
    return slope(train[-window:]) > margin and slope(held_out[-window:]) < -margin


@dataclass
class HackingWatch:
    """Series of (training reward, held-out reward) per eval point; checkpointed with the run."""

    train: list[float] = field(default_factory=list)
    held_out: list[float] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)  # training rewards since the last eval
    armed: bool = True

    def observe_step(self, reward_mean: float) -> None:
        self.pending.append(reward_mean)

    def observe_eval(self, eval_reward_mean: float) -> dict[str, Any] | None:
        """Record an eval point; the event data when the alarm goes off now, else None."""
        if self.pending:
            self.train.append(sum(self.pending) / len(self.pending))
            self.held_out.append(eval_reward_mean)
        self.pending = []
        suspected = reward_hacking_suspected(self.train, self.held_out)
        fire, self.armed = suspected and self.armed, not suspected
        if not fire:
            return None
        return {
            "train_reward": self.train[-HACKING_WINDOW:],
            "eval_reward": self.held_out[-HACKING_WINDOW:],
            "train_slope": slope(self.train[-HACKING_WINDOW:]),
            "eval_slope": slope(self.held_out[-HACKING_WINDOW:]),
            "window": HACKING_WINDOW,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "train": list(self.train),
            "held_out": list(self.held_out),
            "pending": list(self.pending),
            "armed": self.armed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train, self.held_out = list(state["train"]), list(state["held_out"])
        self.pending, self.armed = list(state["pending"]), bool(state["armed"])
