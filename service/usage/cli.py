"""`grpo-service tenants set-budget`: the operator's side of usage budgets (docs/usage.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Tenants: usage budgets.")
console = Console(stderr=True)


@app.command("set-budget")
def set_budget(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    device_hours: Annotated[
        float | None,
        typer.Option(min=0, help="Device-hours its jobs may use in all (every device kind)."),
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the budget.")] = False,
) -> None:
    """Set (or --clear) a tenant's device-hour budget. At or over it, new jobs answer 402 and
    running jobs pause at their next step boundary."""
    from service.core.db import session_scope
    from service.usage.budget import budget_state
    from service.usage.service import set_budget as store

    if clear == (device_hours is not None):
        console.print("give either --device-hours H or --clear")
        raise typer.Exit(2)
    with session_scope() as session:
        tenant_id = store(session, tenant, None if clear else device_hours)
        if tenant_id is None:
            console.print(f"no tenant named {tenant!r}")
            raise typer.Exit(1)
        state = budget_state(session, tenant_id)
    if state is None:
        console.print(f"tenant {tenant!r}: no budget")
    else:
        console.print(f"tenant {tenant!r}: budget {state.limit_hours:g} device-hours, "
                      f"{state.used_hours:.4g} used")  # fmt: skip
