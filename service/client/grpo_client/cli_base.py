"""Shared pieces of the `grpo` CLI: the typer apps, options, the client, output helpers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from grpo_client import config
from grpo_client.client import Client
from grpo_client.errors import ClientError
from grpo_client.resources import read_jsonl

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The grpo-service API from a terminal. Every command takes --json for scripts.",
    pretty_exceptions_enable=False,
)
verifiers_app = typer.Typer(no_args_is_help=True, help="Register and test reward functions.")
datasets_app = typer.Typer(no_args_is_help=True, help="Upload and list prompt datasets.")
jobs_app = typer.Typer(no_args_is_help=True, help="Submit, follow and cancel training jobs.")
checkpoints_app = typer.Typer(no_args_is_help=True, help="List, download and delete checkpoints.")
app.add_typer(verifiers_app, name="verifiers")
app.add_typer(datasets_app, name="datasets")
app.add_typer(jobs_app, name="jobs")
app.add_typer(checkpoints_app, name="checkpoints")

# Rich draws for 80 columns when the output is no terminal (a pipe, a file, CI's log) and cuts
# table cells to fit; there nothing wraps, so each line is printed whole.
NO_TERMINAL_WIDTH = 1000


def console(*, stderr: bool = False, **options: Any) -> Console:
    """A Console as wide as the terminal, or (no terminal, no COLUMNS) wide enough for
    whole lines."""
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=NO_TERMINAL_WIDTH if wide else None, **options)


out = console(highlight=False, markup=False)
err = console(stderr=True, highlight=False)
options: dict[str, Any] = {"url": None, "api_key": None, "json": False}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
JobArg = Annotated[str, typer.Argument(help="Job id (job_…).")]
ExistingFile = Annotated[
    Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="Input file.")
]


class BadInput(ClientError):
    """A local file or argument the CLI cannot use (exit 2)."""


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"grpo {version('grpo-client')}")
        raise typer.Exit()


@app.callback()
def root(
    url: Annotated[str | None, typer.Option(help="API base URL (env GRPO_URL).")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key (env GRPO_API_KEY).")] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print it."),
    ] = False,
) -> None:
    options.update(url=url, api_key=api_key)


def client() -> Client:
    try:
        profile = config.resolve(options["url"], options["api_key"])
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if profile.api_key is None:
        raise BadInput("no API key: run `grpo login`, or set GRPO_API_KEY")
    return Client(profile.url, profile.api_key, max_retries=2)


def emit(value: Any, as_json: bool, render: Any = None) -> None:
    """JSON to stdout when asked, else the `render` callback (or a plain print)."""
    if as_json:
        options["json"] = True
        print(json.dumps(_plain(value), indent=2))
    elif render is not None:
        render(value)
    else:
        out.print(value)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def table(columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for name in columns:  # ids are copied into the next command: never cut or wrapped
        table.add_column(name, no_wrap=name == "id", min_width=len(name))
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    return table


def load_spec(path: Path) -> dict[str, Any]:
    """A job spec from YAML or JSON (by content: JSON is tried for .json files)."""
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            spec = json.loads(text)
        else:
            import yaml

            spec = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError both
        raise BadInput(f"{path}: not valid JSON/YAML: {exc}") from None
    except Exception as exc:  # yaml.YAMLError is not a ValueError
        raise BadInput(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(spec, dict):
        raise BadInput(f"{path}: expected a mapping of job fields, got {type(spec).__name__}")
    return spec


def read_records(path: Path) -> list[dict[str, Any]]:
    try:
        records = list(read_jsonl(path))
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if not records:
        raise BadInput(f"{path}: no records")
    return records
