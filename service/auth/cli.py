"""`grpo-service keys list|revoke`: the operator's view of API keys (`create-api-key` makes
them)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True, add_completion=False, help="API keys: list, revoke.")
console = Console(stderr=True)


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else "-"


@app.command("list")
def list_(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """Every key, newest first: id, prefix, tenant, scope, created, last used, revoked. Plain
    columns (one key a line, `-` for none), so that scripts can read them."""
    from service.auth.service import list_api_keys
    from service.core.db import session_scope

    with session_scope() as session:
        rows = list_api_keys(session, tenant)
        lines = [("id", "prefix", "tenant", "scope", "created", "last_used", "revoked")]
        lines += [
            (key.id, key.prefix, name, key.scope, _when(key.created_at),
             _when(key.last_used_at), _when(key.revoked_at))
            for key, name in rows
        ]  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


@app.command("revoke")
def revoke(
    key: Annotated[
        str, typer.Argument(help="The key's id (key_…), its 12-char prefix, or itself.")
    ],
) -> None:
    """Revoke a key: API processes stop accepting it within GRPO_AUTH_CACHE_S seconds."""
    from service.auth.service import revoke_api_key
    from service.core.db import session_scope

    with session_scope() as session:
        count = revoke_api_key(session, key)
    if not count:
        console.print("no active key matches")
        raise typer.Exit(1)
    console.print(f"revoked {count} key(s)")
