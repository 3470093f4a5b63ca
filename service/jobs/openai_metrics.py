"""A fine-tuning job's per-step `metrics` event as OpenAI's clients read it (its `data`: `step`,
`total_steps`, `train_reward_mean`, `train_loss`, `valid_reward_mean`), written beside the
step's own row by `run_writes.record_step`."""

from __future__ import annotations

from typing import Any


def metrics_event(
    step: int, total_steps: int, metrics: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """A step's `metrics` event of a fine-tuning job, as OpenAI's: the message and its data
    (`step`, `total_steps`, `train_reward_mean`, `train_loss`, `valid_reward_mean`)."""
    names = {"reward_mean": "train_reward_mean", "loss": "train_loss",
             "eval_reward_mean": "valid_reward_mean"}  # fmt: skip
    data: dict[str, Any] = {"step": step, "total_steps": total_steps}
    data |= {theirs: metrics[ours] for ours, theirs in names.items() if ours in metrics}
    shown = ", ".join(f"{k}={v:.4g}" for k, v in data.items() if k.startswith(("train", "valid")))
    return f"Step {step}/{total_steps}: {shown}", data
