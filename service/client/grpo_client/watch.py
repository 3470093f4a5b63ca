"""`grpo jobs watch`: a live progress bar with ETA and sparklines of the run's curves."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from grpo_client import Client
from grpo_client.models import SETTLED_STATUSES, EventOut, JobOut

BARS = "▁▂▃▄▅▆▇█"
CURVES = (
    ("reward", "reward_mean"),
    ("held-out", "eval_reward_mean"),
    ("KL", "kl"),
    ("length", "completion_len_mean"),
)
# Beside a sparkline: the longest label ("held-out"), a value ("-0.0001234"), two gaps of 2.
SPARK_MARGIN = 8 + 10 + 4
EVENT_STYLES = {"reward_hacking_suspected": "bold red", "failed": "red", "warning": "yellow"}


def sparkline(values: list[float | None], width: int = 40) -> str:
    """Unicode bars of the last `width` finite values, scaled to their own min..max."""
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    finite = finite[-width:]
    if not finite:
        return ""
    lo, hi = min(finite), max(finite)
    span = hi - lo
    if span <= 0:
        return BARS[len(BARS) // 2] * len(finite)
    return "".join(BARS[min(len(BARS) - 1, int((v - lo) / span * len(BARS)))] for v in finite)


def eta_seconds(rows: list[dict[str, Any]], total: int) -> float | None:
    """Remaining steps times the mean step time of the last 10 steps."""
    times = [
        r["step_seconds"] for r in rows[-10:] if isinstance(r.get("step_seconds"), int | float)
    ]
    if not rows or not times:
        return None
    return max(0, total - rows[-1]["step"]) * sum(times) / len(times)


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA -:--"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"ETA {hours}:{minutes:02d}:{secs:02d}" if hours else f"ETA {minutes}:{secs:02d}"


def fitting_bar(most: int = 40) -> BarColumn:
    """A progress bar as wide as the terminal leaves beside the other columns, at most `most`:
    a fixed width wider than that pushes the step count and the status off the line."""
    return BarColumn(bar_width=None, table_column=Column(max_width=most))


def curves_table(rows: list[dict[str, Any]], width: int = 80) -> Table:
    """The curves' sparklines, each as long as a line `width` wide holds (at most 40)."""
    table = Table.grid(padding=(0, 2))
    span = max(8, min(40, width - SPARK_MARGIN))
    for label, key in CURVES:
        values = [r.get(key) for r in rows]
        present = [v for v in values if v is not None]
        if not present:
            continue
        table.add_row(label, f"[cyan]{sparkline(values, span)}[/]", f"{present[-1]:.4g}")
    return table


def event_line(event: EventOut) -> str:
    style = EVENT_STYLES.get(event.type, "dim")
    return f"[{style}]{event.at:%H:%M:%S} {event.type}[/]: {event.message}"


def watch(
    client: Client, job_id: str, console: Console, *, as_json: bool, interval: float
) -> JobOut:
    """Follow a job until it ends or pauses, printing events and redrawing the progress;
    returns the job."""
    job = client.jobs.get(job_id)
    rows: list[dict[str, Any]] = []
    last_event = 0
    progress = Progress(
        fitting_bar(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}"),
        TextColumn("{task.fields[status]}"),
        console=console,
    )
    task = progress.add_task(job_id, total=job.total_steps, eta="", status=job.status)

    def poll() -> JobOut:
        nonlocal last_event
        current = client.jobs.get(job_id)
        new_rows = client.jobs.metrics(job_id, after_step=rows[-1]["step"] if rows else 0)
        rows.extend(new_rows)
        events = client.jobs.events(job_id, after=last_event)
        if events:
            last_event = events[-1].id
        if as_json:
            for row in new_rows:
                print(json.dumps({"metrics": row}), flush=True)
            for event in events:
                print(json.dumps({"event": event.model_dump(mode="json")}), flush=True)
        else:
            for event in events:
                console.print(event_line(event))
        status = current.status
        if rows and "reward_mean" in rows[-1]:
            status += f"  reward {rows[-1]['reward_mean']:.3f}"
        eta = _fmt_eta(eta_seconds(rows, current.total_steps))
        progress.update(task, completed=current.step, eta=eta, status=status)
        return current

    if as_json:
        while True:
            job = poll()
            if job.status in SETTLED_STATUSES:
                return job
            time.sleep(interval)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            job = poll()
            live.update(Group(progress, curves_table(rows, console.width)))
            if job.status in SETTLED_STATUSES:
                break
            time.sleep(interval)
    if not console.is_terminal:  # rich ends the display's last line on a terminal only
        console.line()
    return job
