"""`grpo jobs get`: one job at a glance: where it is, how its reward moved since the start,
what went wrong last, and the checkpoint to download."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from grpo_client import Client
from grpo_client.models import CheckpointOut, EventOut, JobOut

# The event types a user should hear about (docs/api.md, "Event types"): the dashboard and the
# OpenAI-compatible events call the same ones `warn`, or `error` for a lost rank.
WARNING_EVENTS = frozenset(
    {
        "warning",
        "reward_hacking_suspected",
        "no_worker",
        "rollouts_not_stored",
        "verifier_errors",
        "environment_errors",
        "attempt_ended",
        "rank_failed",
    }
)


def sig3(value: object) -> str:
    """A metric as a person reads it: 3 significant digits (0.412, 1.23e-05); other values
    as they are, nothing for None."""
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


@dataclass
class JobSummary:
    job: JobOut
    first_reward: float | None  # the reward_mean of the first step with one
    last_warning: EventOut | None
    latest_checkpoint: CheckpointOut | None


def summarize(grpo: Client, job_id: str) -> JobSummary:
    job = grpo.jobs.get(job_id)
    rewards = [r.get("reward_mean") for r in grpo.jobs.metrics(job_id)]
    first = next((r for r in rewards if isinstance(r, int | float)), None)
    warning, after = None, 0
    while events := grpo.jobs.events(job_id, after=after):  # a page at a time, oldest first
        after = events[-1].id
        warning = next((e for e in reversed(events) if e.type in WARNING_EVENTS), warning)
    latest = max(grpo.checkpoints.list(job_id), key=lambda c: c.step, default=None)
    return JobSummary(job, first, warning, latest)


def summary_table(summary: JobSummary) -> Table:
    job = summary.job
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("job", " ".join(filter(None, [job.id, job.spec.get("name")])))
    table.add_row("status", job.status)
    table.add_row("step", f"{job.step} of {job.total_steps}")
    reward = (job.latest_metrics or {}).get("reward_mean")
    if reward is not None:
        first = summary.first_reward
        start = "" if first is None else f" (at start {sig3(first)})"
        table.add_row("reward", f"{sig3(reward)}{start}")
    table.add_row("model", str(job.spec.get("base_model")))
    if job.error:
        table.add_row("error", f"{job.error.code}: {job.error.message}")
    if summary.last_warning:
        w = summary.last_warning
        table.add_row("warning", f"{w.at:%Y-%m-%d %H:%M:%S} {w.type}: {w.message}")
    ckpt = summary.latest_checkpoint
    table.add_row(
        "checkpoint",
        f"step {ckpt.step}, {ckpt.size_bytes / 1e6:.1f} MB, {ckpt.id}" if ckpt else "none yet",
    )
    return table
