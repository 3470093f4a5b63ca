"""`grpo environments`: register multi-turn environments from a .py file, list, get, and test
them with scripted turns."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from grpo_client.cli_base import (
    BadInput,
    ExistingFile,
    JsonOpt,
    app,
    client,
    emit,
    err,
    out,
    read_records,
    table,
)

environments_app = typer.Typer(
    no_args_is_help=True, help="Register and test multi-turn environments (tools, episodes)."
)
app.add_typer(environments_app, name="environments")

NameArg = Annotated[str, typer.Argument(help="Environment name.")]


@environments_app.command("create")
def create(
    file: ExistingFile,
    name: Annotated[
        str | None, typer.Option(help="Default: the file's stem (an existing one gets a version).")
    ] = None,
    description: Annotated[str, typer.Option(help="Free text.")] = "",
    timeout_s: Annotated[
        float | None, typer.Option(help="Per-batch deadline (default 10).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a Python file defining `step(messages, record)` (optionally `reset`, `tools`)."""
    with client() as grpo:
        env = grpo.environments.create_from_file(file, name, description, timeout_s=timeout_s)
    emit(
        env, as_json, lambda e: out.print(f"{e.name} version {e.version} ({e.id}, {e.sha256[:12]})")
    )


@environments_app.command("list")
def list_(
    name: Annotated[str | None, typer.Option(help="Only this name's versions.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List environment versions, newest first."""
    with client() as grpo:
        page = grpo.environments.list(name=name, limit=limit)
    rows = [[e.name, e.version, e.id, e.sha256[:12], f"{e.created_at:%Y-%m-%d %H:%M}"]
            for e in page.data]  # fmt: skip
    emit(
        page,
        as_json,
        lambda _: out.print(table(["name", "version", "id", "sha256", "created"], rows)),
    )


@environments_app.command("get")
def get(
    name: NameArg,
    version: Annotated[int | None, typer.Option(help="Default: the latest.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """One version: its config (the source) and sha256."""
    with client() as grpo:
        env = grpo.environments.get(name, version)

    def render(e: Any) -> None:
        out.print(f"{e.name} version {e.version} ({e.id}) sha256 {e.sha256}")
        out.print(e.config["source"])

    emit(env, as_json, render)


@environments_app.command("test")
def test(
    name: NameArg,
    samples: ExistingFile,
    version: Annotated[int | None, typer.Option(help="Default: the latest.")] = None,
    max_turns: Annotated[int | None, typer.Option(min=1, max=64, help="Per episode.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a JSONL file of `{record, turns}` samples (turns: the assistant's, in order).
    Exits 1 when every episode ended on an error: the records or turns do not fit the source."""
    records = read_records(samples)
    for number, sample in enumerate(records, 1):
        if not isinstance(sample.get("record"), dict) or not isinstance(sample.get("turns"), list):
            raise BadInput(f"{samples}: line {number}: expected {{record: {{...}}, turns: [...]}}")
    with client() as grpo:
        result = grpo.environments.test(name, records, version=version, max_turns=max_turns)

    def render(r: Any) -> None:
        rows = [[i + 1, ep.turns, ep.tool_calls, " ".join(f"{x:g}" for x in ep.rewards),
                 f"{ep.reward:g}", "; ".join(ep.errors)[:60]]
                for i, ep in enumerate(r.results)]  # fmt: skip
        out.print(table(["#", "turns", "tool calls", "rewards", "reward", "errors"], rows))
        out.print(f"{len(rows)} episodes in {r.elapsed_ms:.0f} ms")

    emit(result, as_json, render)
    failed = [ep for ep in result.results if ep.errors]
    if failed and len(failed) == len(result.results):
        # nothing was scored: records of another shape than the source reads, most often
        err.print(
            f"every episode ended on an error (the first: {failed[0].errors[0]}); check the "
            "records' fields against what the environment's reset and step read",
            markup=False,
        )
        raise typer.Exit(1)
