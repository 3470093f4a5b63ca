"""`grpo jobs …` and `grpo checkpoints …`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from grpo_client.cli_base import (
    ExistingFile,
    JobArg,
    JsonOpt,
    checkpoints_app,
    client,
    console,
    emit,
    err,
    jobs_app,
    load_spec,
    out,
    table,
)
from grpo_client.cli_preflight import preflight_or_stop
from grpo_client.job_summary import sig3, summarize, summary_table
from grpo_client.models import JobOut
from grpo_client.watch import fitting_bar, watch

StepOpt = Annotated[str, typer.Option(help="A step number, or latest.")]


def _progress(job: JobOut) -> str:
    return f"{job.step}/{job.total_steps}"


def _job_line(job: JobOut) -> str:
    reward = (job.latest_metrics or {}).get("reward_mean")
    extra = f"  reward {sig3(reward)}" if isinstance(reward, int | float) else ""
    error = f"  {job.error.code}: {job.error.message}" if job.error else ""
    return f"{job.id}  {job.status}  step {_progress(job)}{extra}{error}"


def _finish(job: JobOut) -> None:
    if job.status != "succeeded":
        raise typer.Exit(1)


@jobs_app.command("create")
def jobs_create(
    file: ExistingFile,
    follow: Annotated[bool, typer.Option("--watch", help="Then watch it to the end.")] = False,
    preflight: Annotated[
        bool, typer.Option("--preflight", help="Pre-flight it first (docs/preflight.md).")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Submit even on a fatal pre-flight warning.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job from a YAML or JSON spec (every field and its default: docs/api.md#job-spec).

    For example:

    \b
        name: digits-run-1
        base_model: tiny              # GET /v1/models (grpo-service models add ...)
        dataset: digits               # an id (ds_...) or the name of one of your datasets
        verifiers: [{name: digits}]   # pinned to the latest version at submission
        grpo: {steps: 30, prompts_per_step: 2, group_size: 8, learning_rate: 0.002}
        generation: {max_new_tokens: 16}
        checkpoint_every: 10
        lora: null                    # or {r: 16, alpha: 32}"""
    spec = load_spec(file)
    with client() as grpo:
        if preflight:  # its report on stderr: stdout stays the job (--json)
            preflight_or_stop(grpo, spec, force, console(stderr=True, highlight=False))
        job = grpo.jobs.create(spec)
        emit(job, as_json, lambda j: out.print(f"submitted {_job_line(j)}"))
        if follow:
            job = watch(grpo, job.id, console(stderr=True), as_json=as_json, interval=1.0)
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
            sig3((j.latest_metrics or {}).get("reward_mean")),
            f"{j.created_at:%Y-%m-%d %H:%M}",
            j.spec.get("base_model"),
            j.spec.get("name"),
        ]
        for j in page.data
    ]
    columns = ["id", "status", "step", "reward", "created", "model", "name"]
    emit(page, as_json, lambda _: out.print(table(columns, rows)))


@jobs_app.command("events")
def jobs_events(
    job_id: JobArg,
    after: Annotated[int, typer.Option(min=0, help="Only events after this id.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """A job's events: status changes, checkpoints, warnings."""
    with client() as grpo:
        events = grpo.jobs.events(job_id, after=after)
    rows = [[e.id, f"{e.at:%Y-%m-%d %H:%M:%S}", e.type, e.message] for e in events]
    emit(events, as_json, lambda _: out.print(table(["id", "at", "type", "message"], rows)))


@jobs_app.command("get")
def jobs_get(job_id: JobArg, as_json: JsonOpt = False) -> None:
    """Show one job: status, step, reward now and at the start, the last warning or error,
    the latest checkpoint (with --json: the job as the API answers it)."""
    with client() as grpo:
        if as_json:
            emit(grpo.jobs.get(job_id), as_json)
        else:
            out.print(summary_table(summarize(grpo, job_id)))


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
        job = watch(grpo, job_id, console(), as_json=as_json, interval=interval)
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


@jobs_app.command("pause")
def jobs_pause(job_id: JobArg, as_json: JsonOpt = False) -> None:
    """Pause a job: a running one checkpoints at its next step and frees its device."""
    with client() as grpo:
        job = grpo.jobs.pause(job_id)
    emit(job, as_json, lambda j: out.print(_job_line(j)))


@jobs_app.command("resume")
def jobs_resume(job_id: JobArg, as_json: JsonOpt = False) -> None:
    """Queue a paused job again; it continues from the checkpoint its pause saved."""
    with client() as grpo:
        job = grpo.jobs.resume(job_id)
    emit(job, as_json, lambda j: out.print(_job_line(j)))


@jobs_app.command("fork")
def jobs_fork(
    job_id: JobArg,
    step: StepOpt = "latest",
    overrides: Annotated[
        Path | None,
        typer.Option(
            "--overrides",
            exists=True,
            dir_okay=False,
            help="YAML or JSON of the spec fields to change, e.g. {grpo: {learning_rate: 5e-6}}.",
        ),
    ] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="Set grpo.learning_rate.")] = None,
    beta: Annotated[float | None, typer.Option(help="Set grpo.beta.")] = None,
    steps: Annotated[int | None, typer.Option(help="Set grpo.steps.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """A new job from this job's checkpoint at --step, some knobs changed (docs/lifecycle.md)."""
    changes = load_spec(overrides) if overrides else {}
    grpo_changes = {"learning_rate": lr, "beta": beta, "steps": steps}
    if any(v is not None for v in grpo_changes.values()):
        changes["grpo"] = {
            **changes.get("grpo", {}),
            **{k: v for k, v in grpo_changes.items() if v is not None},
        }
    with client() as grpo:
        job = grpo.jobs.fork(job_id, int(step) if step.isdigit() else step, changes)
    emit(job, as_json, lambda j: out.print(f"forked {_job_line(j)}"))


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


@jobs_app.command("report")
def jobs_report(
    job_id: JobArg,
    output: Annotated[Path, typer.Option("--out", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Write one self-contained HTML report of a job: curves, samples, spec, verifiers,
    checkpoints, events (open it in any browser; it loads nothing from the network)."""
    from grpo_client.report import build_report

    with client() as grpo:
        html = build_report(grpo, job_id)
    output.write_text(html, encoding="utf-8")
    emit(
        {"job": job_id, "report": str(output)}, as_json, lambda v: err.print(f"wrote {v['report']}")
    )


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
        str | None,
        typer.Option(
            "--out",
            help="File, or folder for <job>-step-<n>.tar; with --extract, a path that is not "
            "a folder yet and does not end in .tar is the folder to unpack into.",
        ),
    ] = None,
    extract: Annotated[
        bool, typer.Option(help="Unpack it next to the tar (a folder from_pretrained loads).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Download a checkpoint tar (resumable; its sha256 is checked)."""
    if step != "latest" and not step.isdigit():
        raise typer.BadParameter("a step number or 'latest'", param_hint="--step")
    into = _unpack_folder(out_path) if extract else None
    if into is not None:  # the tar goes inside it, and is removed once unpacked
        into.mkdir(parents=True, exist_ok=True)
        out_path = str(into)
    with client() as grpo:
        ckpt = grpo.checkpoints.get(job_id, step)
        bar = Progress(
            "[progress.description]{task.description}",
            fitting_bar(),
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
    if into is not None:
        result["extracted"] = str(_extract(path, into))
        path.unlink()
        result["path"] = str(into)
    elif extract:
        result["extracted"] = str(_extract(path, path.with_suffix("")))
    shown = result.get("extracted", result["path"])
    emit(result, as_json, lambda r: out.print(f"{shown}  sha256 {r['sha256']} ok"))


def _unpack_folder(out_path: str | None) -> Path | None:
    """The folder `--out` names for --extract to unpack into: a path that is not a folder yet
    and does not end in .tar (an existing folder keeps its meaning: where the tar goes)."""
    if out_path is None:
        return None
    target = Path(out_path)
    return None if target.is_dir() or target.suffix == ".tar" else target


def _extract(archive: Path, folder: Path) -> Path:
    """Unpack `archive` into `folder`; the tar's members stay inside it."""
    import tarfile

    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")  # no absolute paths, links or devices
    return folder


@checkpoints_app.command("delete")
def checkpoints_delete(
    job_id: JobArg,
    step: Annotated[str, typer.Option(help="A step number, or latest (no default).")],
    as_json: JsonOpt = False,
) -> None:
    """Delete a checkpoint (refused while a live job resumes or starts from it)."""
    if step != "latest" and not step.isdigit():
        raise typer.BadParameter("a step number or 'latest'", param_hint="--step")
    with client() as grpo:
        grpo.checkpoints.delete(job_id, step)
    result = {"job_id": job_id, "step": step, "deleted": True}
    emit(result, as_json, lambda r: out.print(f"deleted checkpoint {r['step']} of {r['job_id']}"))
