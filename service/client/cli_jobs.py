"""`grpo jobs …` and `grpo checkpoints …`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from service.client.cli_base import (
    ExistingFile,
    JobArg,
    JsonOpt,
    checkpoints_app,
    client,
    emit,
    err,
    jobs_app,
    load_spec,
    out,
    table,
)
from service.client.models import JobOut
from service.client.watch import watch

StepOpt = Annotated[str, typer.Option(help="A step number, or latest.")]


def _progress(job: JobOut) -> str:
    return f"{job.step}/{job.total_steps}"


def _job_line(job: JobOut) -> str:
    reward = (job.latest_metrics or {}).get("reward_mean")
    extra = f"  reward {reward:.3f}" if isinstance(reward, int | float) else ""
    error = f"  {job.error.code}: {job.error.message}" if job.error else ""
    return f"{job.id}  {job.status}  step {_progress(job)}{extra}{error}"


def _finish(job: JobOut) -> None:
    if job.status != "succeeded":
        raise typer.Exit(1)


@jobs_app.command("create")
def jobs_create(
    file: ExistingFile,
    follow: Annotated[bool, typer.Option("--watch", help="Then watch it to the end.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job from a YAML or JSON spec."""
    spec = load_spec(file)
    with client() as grpo:
        job = grpo.jobs.create(spec)
        emit(job, as_json, lambda j: out.print(f"submitted {_job_line(j)}"))
        if follow:
            job = watch(grpo, job.id, Console(stderr=True), as_json=as_json, interval=1.0)
            if not as_json:
                out.print(_job_line(job))
            _finish(job)


@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option(help="queued, running, succeeded, …")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    with client() as grpo:
        page = grpo.jobs.list(status=status, limit=limit)
    rows = [
        [
            j.id,
            j.status,
            _progress(j),
            (j.latest_metrics or {}).get("reward_mean"),
            f"{j.created_at:%Y-%m-%d %H:%M}",
            j.spec.get("base_model"),
        ]
        for j in page.data
    ]
    columns = ["id", "status", "step", "reward", "created", "model"]
    emit(page, as_json, lambda _: out.print(table(columns, rows)))


@jobs_app.command("get")
def jobs_get(job_id: JobArg, as_json: JsonOpt = False) -> None:
    """Show one job."""
    with client() as grpo:
        job = grpo.jobs.get(job_id)
    emit(job, as_json, lambda j: out.print(_job_line(j)))


@jobs_app.command("watch")
def jobs_watch(
    job_id: JobArg,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between polls.")] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Follow a job live: progress, ETA, reward/KL/length sparklines, events.

    Exits 1 unless the job succeeds. With --json: a line `{"metrics": row}` or `{"event": event}`
    per update, then the final job."""
    with client() as grpo:
        job = watch(grpo, job_id, Console(stderr=False), as_json=as_json, interval=interval)
    if as_json:
        emit(job, True)
    else:
        out.print(_job_line(job))
    _finish(job)


@jobs_app.command("cancel")
def jobs_cancel(job_id: JobArg, as_json: JsonOpt = False) -> None:
    """Cancel a job (a running one stops at its next step)."""
    with client() as grpo:
        job = grpo.jobs.cancel(job_id)
    emit(job, as_json, lambda j: out.print(_job_line(j)))


@jobs_app.command("metrics")
def jobs_metrics(
    job_id: JobArg,
    after_step: Annotated[int, typer.Option(min=0)] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Print the metrics rows (reward, KL, loss, length, step time)."""
    with client() as grpo:
        rows = grpo.jobs.metrics(job_id, after_step)
    keys = ["step", "reward_mean", "eval_reward_mean", "kl", "loss", "completion_len_mean"]
    keys += ["step_seconds"]
    table_rows = [[_num(r.get(k)) for k in keys] for r in rows]
    emit(rows, as_json, lambda _: out.print(table(keys, table_rows)))


def _num(value: object) -> object:
    return f"{value:.4g}" if isinstance(value, float) else value


@checkpoints_app.command("list")
def checkpoints_list(job_id: JobArg, as_json: JsonOpt = False) -> None:
    """List a job's checkpoints."""
    with client() as grpo:
        ckpts = grpo.checkpoints.list(job_id)
    rows = [[c.step, c.format, c.size_bytes, c.sha256[:16], c.id] for c in ckpts]
    emit(
        ckpts,
        as_json,
        lambda _: out.print(table(["step", "format", "bytes", "sha256", "id"], rows)),
    )


@checkpoints_app.command("download")
def checkpoints_download(
    job_id: JobArg,
    step: StepOpt = "latest",
    out_path: Annotated[
        str | None, typer.Option("--out", help="File, or folder for <job>-step-<n>.tar.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Download a checkpoint tar (resumable; its sha256 is checked)."""
    if step != "latest" and not step.isdigit():
        raise typer.BadParameter("a step number or 'latest'", param_hint="--step")
    with client() as grpo:
        ckpt = grpo.checkpoints.get(job_id, step)
        bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            disable=as_json,
        )
        with bar:
            task = bar.add_task(f"step {ckpt.step}", total=ckpt.size_bytes)
            path = grpo.checkpoints.download(
                job_id,
                ckpt.step,
                out_path,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    result = {"path": str(path), "step": ckpt.step, "sha256": ckpt.sha256, "bytes": ckpt.size_bytes}
    emit(result, as_json, lambda r: out.print(f"{r['path']}  sha256 {r['sha256']} ok"))
