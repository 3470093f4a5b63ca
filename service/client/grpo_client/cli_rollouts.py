"""`grpo jobs rollouts`: a step's completions as a table (or JSON), or all of them as Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from grpo_client.cli_base import JobArg, JsonOpt, client, emit, err, jobs_app, out, table
from grpo_client.rollouts import RolloutOut

SplitOpt = Annotated[str | None, typer.Option(help="train or eval (default: both).")]


@jobs_app.command("rollouts")
def jobs_rollouts(
    job_id: JobArg,
    step: Annotated[int | None, typer.Option(min=1, help="The step to show.")] = None,
    split: SplitOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="Most rows shown.")] = 200,
    download: Annotated[
        Path | None, typer.Option("--download", help="Write every rollout to this Parquet file.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """A step's completions: reward, advantage, verifier scores and the completion (cut to the
    terminal), or with --download every stored rollout as one Parquet file."""
    if split not in (None, "train", "eval"):
        raise typer.BadParameter("train or eval", param_hint="--split")
    if download is not None:
        with client() as grpo:
            path = grpo.jobs.download_rollouts(job_id, download, split=split)
        result = {"path": str(path), "bytes": path.stat().st_size}
        emit(result, as_json, lambda r: err.print(f"wrote {r['path']} ({r['bytes']} bytes)"))
        return
    if step is None:
        raise typer.BadParameter("give --step N (or --download FILE)", param_hint="--step")
    with client() as grpo:
        rows: list[RolloutOut] = []
        for row in grpo.jobs.rollouts(job_id, step=step, split=split, limit=min(limit, 100)):
            rows.append(row)
            if len(rows) >= limit:
                break
    emit(rows, as_json, lambda _: out.print(_table(rows)))


def _table(rows: list[RolloutOut]) -> object:
    names = sorted({name for r in rows for name in r.scores})
    columns = ["split", "group", "index", "record", "reward", "advantage", *names, "len"]
    cells = [
        [
            r.split, r.group, r.index, r.record, f"{r.reward:.3f}",
            "" if r.advantage is None else f"{r.advantage:+.3f}",
            *(_score(r, name) for name in names),
            f"{r.length}{'+' if r.truncated else ''}",
        ]
        for r in rows
    ]  # fmt: skip
    # The completion takes what the other columns leave of the terminal, on one line.
    width = max(20, out.width - sum(max(len(c), 6) + 1 for c in columns) - 2)
    grid = table([*columns, "completion"], [[*c, _cut(r.completion, width)]
                                            for c, r in zip(cells, rows, strict=True)])  # fmt: skip
    return grid


def _score(row: RolloutOut, name: str) -> str:
    if name in row.errors:
        return "error"
    value = row.scores.get(name)
    return "" if value is None else f"{value:.3f}"


def _cut(text: str, width: int) -> str:
    flat = " ".join(text.split())  # newlines would break the table's rows
    return flat if len(flat) <= width else flat[: width - 1] + "…"
