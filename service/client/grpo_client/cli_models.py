"""`grpo models`: the names a job's `base_model` (and inference's `model`) takes."""

from __future__ import annotations

from rich.table import Table

from grpo_client.cli_base import JsonOpt, app, client, emit, out, table
from grpo_client.models_generated import ModelOut


@app.command("models")
def models(as_json: JsonOpt = False) -> None:
    """List the model catalog and your own models (GET /v1/models): any id here can be a
    job's `base_model`."""
    with client() as grpo:
        listed = grpo.models.list()
    emit(listed, as_json, lambda rows: out.print(_table(rows)))


def _table(rows: list[ModelOut]) -> Table:
    columns = ["id", "kind", "root", "parameters", "context", "chat"]
    return table(
        columns,
        [
            [m.id, m.kind, m.root, f"{m.num_parameters:,}", m.context_length,
             "yes" if m.chat_template else "no"]
            for m in rows
        ],
    )  # fmt: skip
