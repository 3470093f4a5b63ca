"""`grpo-service secrets rotate`: the operator's side of tenant secrets."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Tenant secrets (tracker keys, webhook keys)."
)
console = Console(stderr=True)


@app.command("rotate")
def rotate() -> None:
    """Re-encrypt every stored secret under the first key of GRPO_SECRETS_KEY (set it to
    NEW,OLD first; drop OLD once this reports no unreadable rows)."""
    from service.core.db import get_sessionmaker
    from service.secrets.crypto import SecretsUnavailable
    from service.secrets.rotation import rotate_secrets
    from service.settings import get_settings

    try:
        outcome = rotate_secrets(get_sessionmaker(), get_settings())
    except SecretsUnavailable as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    console.print(f"{outcome.rotated} secret(s) re-encrypted under the first key")
    for name in outcome.unreadable:
        console.print(f"[yellow]{name}: decrypts under none of the keys; left as it was[/yellow]")
    raise typer.Exit(1 if outcome.unreadable else 0)
