"""`grpo-service models add|list|remove`: the operator's side of the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The model catalog: the base models tenants may name in `base_model`.",
)
console = Console(stderr=True)


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The name tenants use, e.g. qwen2.5-0.5b.")],
    source: Annotated[str, typer.Argument(help="A directory on the workers, or a Hub model id.")],
    revision: Annotated[
        str | None, typer.Option(help="Hub branch, tag or commit (default: main).")
    ] = None,
) -> None:
    """Register a model: read its config and tokenizer (a Hub id is downloaded once into the
    shared HF_HOME cache), and store what jobs are checked against."""
    from service.catalog.inspect import ModelSourceError, fetch_hub, inspect_model, is_local_source
    from service.catalog.service import CatalogError, add_model
    from service.core.db import session_scope
    from service.settings import get_settings
    from service.storage import open_storage_from_settings

    settings = get_settings()
    try:
        if is_local_source(source):
            path, kind = Path(source).expanduser().resolve(), "local"
            if not path.is_dir():
                raise ModelSourceError(f"{path} is not a directory")
        else:
            token = settings.hf_token.get_secret_value() if settings.hf_token else None
            path, kind = fetch_hub(source, revision, token, settings.hf_offline), "hub"
        facts = inspect_model(path, kind)
        with session_scope() as session:
            row = add_model(session, open_storage_from_settings(settings), name, source, facts)
            _print([row])
    except (ModelSourceError, CatalogError) as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(2) from None


@app.command("list")
def list_() -> None:
    """The catalog, one model a row."""
    from service.catalog.service import list_models
    from service.core.db import session_scope

    with session_scope() as session:
        _print(list_models(session))


@app.command("remove")
def remove(name: Annotated[str, typer.Argument(help="The model's catalog name.")]) -> None:
    """Remove a model (refused while a live job trains from it); finished jobs keep its name."""
    from service.catalog.service import CatalogError, remove_model
    from service.core.db import session_scope

    try:
        with session_scope() as session:
            remove_model(session, name)
    except CatalogError as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(2) from None
    console.print(f"removed {name}")


def _print(rows: list) -> None:
    table = Table()
    # The name is what a job's base_model says: one line, never cut at any terminal width.
    table.add_column("name", no_wrap=True, min_width=max((len(r.name) for r in rows), default=4))
    for column in ("source", "architecture", "parameters", "context", "chat", "dtype", "size",
                   "revision"):  # fmt: skip
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.name, r.source, r.architecture, f"{r.num_parameters:,}", str(r.context_length),
            "yes" if r.has_chat_template else "no", r.dtype, f"{r.size_bytes / 2**20:.1f} MiB",
            r.revision[:12],
        )  # fmt: skip
    Console().print(table)
