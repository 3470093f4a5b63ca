"""`grpo usage` (the tenant's usage as a table) and `grpo jobs estimate SPEC`."""

from __future__ import annotations

from typing import Annotated

import typer

from grpo_client.cli_base import (
    ExistingFile,
    JsonOpt,
    app,
    client,
    emit,
    jobs_app,
    load_spec,
    out,
    table,
)
from grpo_client.models_generated import EstimateOut, UsageFigures, UsageReport


@app.command("usage")
def usage(
    start: Annotated[
        str | None, typer.Option("--from", help="RFC 3339 date or date-time (default: the 1st).")
    ] = None,
    end: Annotated[
        str | None, typer.Option("--to", help="The end, exclusive (default: the month's end).")
    ] = None,
    by: Annotated[str, typer.Option("--by", help="day or job.")] = "day",
    as_json: JsonOpt = False,
) -> None:
    """What your jobs used: device-hours, tokens, verifier CPU, storage; by day or by job."""
    if by not in ("day", "job"):
        raise typer.BadParameter("day or job", param_hint="--by")
    with client() as grpo:
        report = grpo.usage.report(start, end, by)
    emit(report, as_json, lambda r: out.print(_table(r)))


def _table(report: UsageReport) -> object:
    head = "job" if report.group_by == "job" else "day"
    columns = [head, "device-h", "completion tok", "trained tok", "verifier cpu-s", "storage MB"]
    rows = [[r.job_id if report.group_by == "job" else r.day, *_figures(r)] for r in report.data]
    rows.append(["total", *_figures(report.totals)])
    grid = table(columns, rows)
    grid.title = f"usage {report.from_} .. {report.to} (exclusive)"
    if report.budget is not None:
        b = report.budget
        grid.caption = f"budget: {b.device_hours_used:.4g} of {b.device_hours_limit:g} device-h"
    return grid


def _figures(r: UsageFigures) -> list[str]:
    return [
        f"{r.device_seconds / 3600:.4f}", f"{r.completion_tokens:,}", f"{r.trained_tokens:,}",
        f"{r.verifier_cpu_seconds:.2f}", f"{r.storage_bytes / 1e6:.2f}",
    ]  # fmt: skip


@jobs_app.command("estimate")
def jobs_estimate(spec: ExistingFile, as_json: JsonOpt = False) -> None:
    """Device-hours and tokens a job spec (YAML or JSON) would take; nothing is submitted."""
    body = load_spec(spec)
    with client() as grpo:
        estimate = grpo.usage.estimate(body)
    emit(estimate, as_json, lambda e: out.print(_estimate(e)))


def _estimate(e: EstimateOut) -> str:
    basis = e.basis + (f" ({e.basis_id})" if e.basis_id else "")
    return (
        f"{e.device_seconds / 3600:.4g} device-hours ({e.device_seconds:.1f} s), "
        f"{e.completion_tokens:,} completion tokens, {e.trained_tokens:,} trained tokens; "
        f"basis: {basis}"
    )
