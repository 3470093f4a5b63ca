"""`grpo jobs create --preflight`: the pre-flight's figures and warnings, and the stop before a
job whose run a fatal warning dooms (unless --force)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from grpo_client.client import Client
from grpo_client.preflight import PreflightOut

FIGURES = (
    ("reward_mean", "reward mean"),
    ("reward_std", "reward std"),
    ("zero_std_fraction", "groups with one reward"),
    ("verifier_error_rate", "verifier error rate"),
    ("truncated_fraction", "truncated completions"),
    ("completion_len_mean", "completion tokens (mean)"),
    ("seconds_per_step_estimate", "seconds per step (estimate)"),
)


def render(result: PreflightOut, console: Console) -> None:
    if result.status != "succeeded":
        why = f"{result.error.code}: {result.error.message}" if result.error else ""
        console.print(Text.assemble((f"pre-flight {result.id} {result.status}", "red"), f" {why}"))
        return
    figures = Table(title=f"pre-flight {result.id}", box=None, show_header=False)
    figures.add_column("figure")
    figures.add_column("value", justify="right")
    for key, label in FIGURES:
        figures.add_row(label, _num(getattr(result, key)))
    if result.memory_estimate:
        figures.add_row("memory estimate (GiB)", _num(result.memory_estimate["total"] / 2**30))
    console.print(figures)
    for w in result.warnings:
        label = ("fatal", "bold red") if w.fatal else ("warning", "yellow")
        console.print(Text.assemble(label, f" {w.code}: {w.message}"))  # no markup: server text


def preflight_or_stop(grpo: Client, spec: dict[str, Any], force: bool, console: Console) -> None:
    """Run the pre-flight and show it; exit 1 before any job exists when it failed or raised a
    fatal warning, unless `force`."""
    result = grpo.jobs.preflight(spec)
    render(result, console)
    doomed = result.status != "succeeded" or any(w.fatal for w in result.warnings)
    if doomed and not force:
        console.print("no job submitted (--force submits it anyway)")
        raise typer.Exit(1)


def _num(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
