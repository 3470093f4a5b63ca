"""`grpo-service`: run the API, the worker or both; migrate; manage keys; make a tiny model;
train locally."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from service.supervisor import Supervisor, api_command, worker_command

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_enable=False
)
console = Console(stderr=True)

HostOpt = Annotated[str, typer.Option(help="Interface to bind.")]
PortOpt = Annotated[int, typer.Option(help="Port to listen on.")]
GraceOpt = Annotated[
    float, typer.Option(help="Seconds a stopping worker gets to checkpoint and hand back its job.")
]


def _log_sandbox_mode() -> None:
    from workers.verifiers import sandbox_mode

    mode = sandbox_mode()
    style = {"bubblewrap": "green", "unsafe-subprocess": "bold red"}.get(mode, "yellow")
    console.print(f"python verifier sandbox: [{style}]{mode}[/]")


@app.command()
def migrate() -> None:
    """Upgrade the database schema to the latest revision."""
    from service.migrate import upgrade

    upgrade()
    console.print("database migrated")


@app.command()
def api(
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn processes (one per core).")] = 1,
) -> None:
    """Run the REST API (uvicorn)."""
    raise typer.Exit(Supervisor([api_command(host, port, workers)]).run())


@app.command()
def worker(
    queue: Annotated[str, typer.Option(help="Queue to consume.")] = "gpu",
    grace_seconds: GraceOpt = 600.0,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve the worker's Prometheus metrics on this port.")
    ] = None,
) -> None:
    """Run a Celery training worker (one job at a time) and the reconciler."""
    from workers.observability import cleanup_metrics, serve_metrics

    _log_sandbox_mode()
    folder = serve_metrics(metrics_port) if metrics_port else None
    supervisor = Supervisor([worker_command(queue)], grace_seconds=grace_seconds, reconcile=True)
    try:
        code = supervisor.run()
    finally:
        if folder:
            cleanup_metrics(folder)
    raise typer.Exit(code)


@app.command()
def up(host: HostOpt = "127.0.0.1", port: PortOpt = 8000, grace_seconds: GraceOpt = 600.0) -> None:
    """Embedded mode: migrate, then run the API and one worker together until Ctrl-C/SIGTERM."""
    from service.migrate import upgrade
    from service.settings import get_settings

    settings = get_settings()
    upgrade()
    mode = "embedded" if settings.embedded else "production"
    _log_sandbox_mode()
    console.print(f"grpo-service up ({mode}) on http://{host}:{port}, data in {settings.data_path}")
    commands = [api_command(host, port), worker_command("gpu")]
    raise typer.Exit(Supervisor(commands, grace_seconds=grace_seconds, reconcile=True).run())


@app.command("create-api-key")
def create_api_key(
    tenant: Annotated[str, typer.Option(help="Tenant name (created if new).")],
) -> None:
    """Create an API key; it is printed once, alone on the last line."""
    from service.auth.service import create_api_key as create
    from service.db import session_scope

    with session_scope() as session:
        secret = create(session, tenant)
    console.print(f"API key for tenant '{tenant}' (shown once):")
    print(secret)


@app.command("revoke-api-key")
def revoke_api_key(
    key: Annotated[str, typer.Argument(help="The key, or its 12-char prefix.")],
) -> None:
    """Revoke an API key."""
    from service.auth.service import revoke_api_key as revoke
    from service.db import session_scope

    with session_scope() as session:
        count = revoke(session, key)
    if not count:
        console.print("no active key matches")
        raise typer.Exit(1)
    console.print(f"revoked {count} key(s)")


@app.command("make-tiny-model")
def make_tiny_model(
    path: Annotated[Path, typer.Argument(help="Directory to write.")], seed: int = 0
) -> None:
    """Write a small random-init Llama-shaped causal LM with a local tokenizer."""
    from workers.grpo.tiny_model import make_tiny_model as make

    out = make(path, seed=seed)
    console.print(f"tiny model written to {out}")


@app.command("train")
def train_local(
    spec: Annotated[Path, typer.Argument(help="Job spec JSON; dataset a JSONL path.")],
    out: Annotated[Path, typer.Option(help="Directory for checkpoints.")],
    resume_from: Annotated[
        Path | None, typer.Option(help="Checkpoint directory to continue from.")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
) -> None:
    """Train locally with the GRPO engine (no API, no queue): one JSON line per step."""
    from pydantic import ValidationError

    from workers.local_train import local_errors, run_local

    try:
        run_local(spec, out, resume_from=resume_from, device=device)
    except (ValidationError, OSError, *local_errors()) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


@app.command()
def report(
    job_id: Annotated[str, typer.Argument(help="Job id (job_…).")],
    out: Annotated[Path, typer.Option(help="HTML file to write.")] = Path("report.html"),
    url: Annotated[str | None, typer.Option(help="API URL (env GRPO_URL).")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key (env GRPO_API_KEY).")] = None,
) -> None:
    """Write a self-contained HTML report of a run (curves, spec, verifiers, checkpoints)."""
    from service.client import ClientError
    from service.report import write_report

    try:
        path = write_report(job_id, str(out), url, api_key)
    except ClientError as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(1) from None
    console.print(f"report written to {path}")


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # worker logs, not tqdm bars
    app()


if __name__ == "__main__":
    main()
