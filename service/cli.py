"""`grpo-service`: run the API, the worker or both; migrate; manage keys; make a tiny model;
train locally."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from service.auth.cli import app as keys_app
from service.catalog.cli import app as models_app
from service.secrets.cli import app as secrets_app
from service.supervisor import (
    Supervisor,
    api_command,
    serve_command,
    tinker_worker_command,
    worker_command,
)
from service.usage.cli import app as tenants_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_enable=False
)
console = Console(stderr=True)
app.add_typer(models_app, name="models")
app.add_typer(keys_app, name="keys")
app.add_typer(secrets_app, name="secrets")
app.add_typer(tenants_app, name="tenants")

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
    from service.core.migrate import upgrade

    upgrade()
    console.print("database migrated")


@app.command()
def api(
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="uvicorn worker processes sharing the port. In production keep 1 and run "
            "more containers.",
        ),
    ] = 1,
) -> None:
    """Run the REST API (uvicorn, with the limits of `service.http.http_limits`)."""
    import uvicorn

    from service.http.http_limits import server_options

    # workers=1 serves in this process; more: uvicorn's supervisor, which restarts a dead one
    # and stops them all on SIGTERM/SIGINT (a SIGKILL of it leaves them: use SIGTERM).
    uvicorn.run(
        "service.main:app",
        host=host,
        port=port,
        workers=workers,
        access_log=False,
        **server_options(),
    )


@app.command()
def worker(
    queue: Annotated[str, typer.Option(help="Queue to consume.")] = "gpu",
    devices: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Devices this worker owns (default GRPO_WORKER_DEVICES): it "
            "trains jobs of resources.devices up to this many, one rank per device.",
        ),
    ] = None,
    grace_seconds: GraceOpt = 600.0,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve the worker's Prometheus metrics on this port.")
    ] = None,
) -> None:
    """Run a Celery training worker (one job at a time) and the reconciler."""
    from service.queues.worker_registry import registered
    from service.settings import get_settings
    from service.worker import device_classes
    from workers.observability import cleanup_metrics, serve_metrics

    _log_sandbox_mode()
    settings = get_settings()
    owned = devices or settings.worker_devices
    folder = serve_metrics(metrics_port) if metrics_port else None
    queues = [q for q in queue.split(",") if q]  # Celery's -Q takes a comma-separated list
    # one broker queue per device class it can train (`gpu`, `gpu.x2`, ...): only jobs that fit
    consumed = ",".join(c for q in queues for c in device_classes(q, owned))
    supervisor = Supervisor([worker_command(consumed)], grace_seconds=grace_seconds, reconcile=True)
    try:
        with registered(queues, settings, owned):  # the API warns about queues nobody serves
            code = supervisor.run()
    finally:
        if folder:
            cleanup_metrics(folder)
    raise typer.Exit(code)


@app.command()
def up(
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    grace_seconds: GraceOpt = 600.0,
    serve: Annotated[
        bool, typer.Option(help="Also run `serve` (inference) unless GRPO_INFERENCE_URL is set.")
    ] = True,
    serve_port: Annotated[
        int | None,
        typer.Option(help="serve's port on 127.0.0.1 (default: --port + 1 when free)."),
    ] = None,
    tinker: Annotated[
        bool, typer.Option(help="Also run `tinker-worker` (the Tinker API's requests).")
    ] = True,
) -> None:
    """Embedded mode: migrate, then run the API, one worker, the inference backend and the
    Tinker worker together until Ctrl-C/SIGTERM."""
    from service.core.migrate import upgrade
    from service.queues.worker_registry import registered
    from service.settings import get_settings

    settings = get_settings()
    upgrade()
    mode = "embedded" if settings.embedded else "production"
    _log_sandbox_mode()
    console.print(f"grpo-service up ({mode}) on http://{host}:{port}, data in {settings.data_path}")
    commands = [api_command(host, port), worker_command("gpu")]
    if serve and not settings.inference_url:
        commands.append(_embedded_serve(serve_port or _free_port_near(port + 1)))
    if tinker:
        commands.append(tinker_worker_command())
    with registered(["gpu"], settings):
        code = Supervisor(commands, grace_seconds=grace_seconds, reconcile=True).run()
    raise typer.Exit(code)


def _free_port_near(port: int) -> int:
    """`port` when nothing listens there, else one the kernel picks (serve failing to bind
    would stop every process of `up`)."""
    import socket

    for candidate in (port, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port for serve")


def _embedded_serve(port: int) -> list[str]:
    """serve on loopback, its URL and a fresh shared token in the environment every child
    inherits (the API reads them)."""
    import secrets

    os.environ["GRPO_INFERENCE_URL"] = f"http://127.0.0.1:{port}"
    os.environ["GRPO_INFERENCE_BACKEND"] = "grpo"
    os.environ.setdefault("GRPO_INFERENCE_TOKEN", secrets.token_urlsafe(32))
    console.print(f"inference backend (serve) on http://127.0.0.1:{port}")
    return serve_command("127.0.0.1", port)


@app.command()
def serve(host: HostOpt = "127.0.0.1", port: PortOpt = 8001) -> None:
    """Run the inference backend (OpenAI-compatible, for the API to proxy to; needs
    GRPO_INFERENCE_TOKEN, the same value as the API's)."""
    from service.settings import get_settings

    if get_settings().inference_token is None:
        console.print("error: set GRPO_INFERENCE_TOKEN (the API sends the same value)", style="red")
        raise typer.Exit(2)
    raise typer.Exit(Supervisor([serve_command(host, port)]).run())


@app.command("tinker-worker")
def tinker_worker(
    device: Annotated[
        str | None,
        typer.Option(help="cpu, cuda, cuda:1 (default GRPO_SERVE_DEVICE, else CUDA when present)."),
    ] = None,
) -> None:
    """Execute the Tinker API's queued requests (docs/tinker.md): one base model loaded once
    per catalog model asked for, every run an adapter on it."""
    import logging

    from service.settings import get_settings
    from service.tinker.worker import run_worker

    logging.basicConfig(level=logging.INFO)
    run_worker(get_settings(), device)


@app.command("create-api-key")
def create_api_key(
    tenant: Annotated[str, typer.Option(help="Tenant name (created if new).")],
    scope: Annotated[
        str, typer.Option(help="full, or read: GET and HEAD only (anything else 403).")
    ] = "full",
) -> None:
    """Create an API key; it is printed once, alone on the last line."""
    from service.auth.service import SCOPES, new_api_key
    from service.core.db import session_scope

    if scope not in SCOPES:
        console.print(f"error: --scope must be one of {', '.join(SCOPES)}", style="red")
        raise typer.Exit(2)
    with session_scope() as session:
        key, secret = new_api_key(session, tenant, scope)
        key_id = key.id
    console.print(f"API key {key_id} ({scope}) for tenant '{tenant}' (shown once):")
    print(secret)


@app.command("revoke-api-key")
def revoke_api_key(
    key: Annotated[str, typer.Argument(help="The key, or its 12-char prefix.")],
) -> None:
    """Revoke an API key (the same as `grpo-service keys revoke`)."""
    from service.auth.cli import revoke

    revoke(key)


@app.command("make-tiny-model")
def make_tiny_model(
    path: Annotated[Path, typer.Argument(help="Directory to write.")],
    seed: int = 0,
    chat_template: Annotated[
        bool, typer.Option(help="Give the tokenizer a chat template.")
    ] = False,
    register: Annotated[
        str | None, typer.Option(help="Also add it to the model catalog under this name.")
    ] = None,
) -> None:
    """Write a small random-init Llama-shaped causal LM with a local tokenizer."""
    from workers.grpo.tiny_model import make_tiny_model as make

    out = make(path, seed=seed, chat_template=chat_template)
    console.print(f"tiny model written to {out}")
    if register:
        from service.catalog.cli import add

        add(register, str(out.resolve()), revision=None)


@app.command("train")
def train_local(
    spec: Annotated[Path, typer.Argument(help="Job spec JSON; dataset a JSONL path.")],
    out: Annotated[Path, typer.Option(help="Directory for checkpoints.")],
    resume_from: Annotated[
        Path | None, typer.Option(help="Checkpoint directory to continue from.")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    nproc: Annotated[
        int, typer.Option(help="Processes (torch.distributed; one device each on CUDA).")
    ] = 1,
) -> None:
    """Train locally with the GRPO engine (no API, no queue): one JSON line per step."""
    from pydantic import ValidationError

    from workers.local_train import local_errors, run_local

    shown_as_one_line: tuple[type[Exception], ...] = (ValidationError, OSError, *local_errors())
    try:
        run_local(spec, out, resume_from=resume_from, device=device, nproc=nproc)
    except shown_as_one_line as exc:
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
    from grpo_client import ClientError
    from grpo_client.report import write_report

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
