"""`grpo webhooks`: subscribe URLs to job events, read the delivery log, send a test."""

from __future__ import annotations

from typing import Annotated

import typer

from grpo_client.cli_base import JsonOpt, app, client, emit, err, out, table

webhooks_app = typer.Typer(no_args_is_help=True, help="Signed notifications of job events.")
app.add_typer(webhooks_app, name="webhooks")

HookArg = Annotated[str, typer.Argument(help="Webhook id (wh_…).")]


@webhooks_app.command("create")
def create(
    url: Annotated[str, typer.Argument(help="https URL the deliveries are POSTed to.")],
    event: Annotated[
        list[str] | None,
        typer.Option("--event", "-e", help="An event type (repeat it); default: every one (*)."),
    ] = None,
    description: Annotated[str, typer.Option(help="A note for yourself.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Subscribe a URL; prints the signing secret, which is never shown again."""
    with client() as grpo:
        hook = grpo.webhooks.create(url, event or ["*"], description)

    def render(_: object) -> None:
        out.print(f"{hook.id} → {hook.url} ({', '.join(hook.events)})")
        err.print("signing secret (shown once; keep it with the receiver):")
        out.print(hook.secret)

    emit(hook, as_json, render)


@webhooks_app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """Your webhooks, newest first."""
    with client() as grpo:
        hooks = list(grpo.webhooks.list(limit=100))
    rows = [[h.id, h.url, ",".join(h.events), h.description] for h in hooks]
    emit(hooks, as_json, lambda _: out.print(table(["id", "url", "events", "description"], rows)))


@webhooks_app.command("delete")
def delete(webhook_id: HookArg, as_json: JsonOpt = False) -> None:
    """Delete a webhook; its pending deliveries are dropped."""
    with client() as grpo:
        grpo.webhooks.delete(webhook_id)
    emit({"id": webhook_id, "deleted": True}, as_json, lambda _: err.print(f"deleted {webhook_id}"))


@webhooks_app.command("deliveries")
def deliveries(
    webhook_id: HookArg,
    limit: Annotated[int, typer.Option(min=1, max=100, help="Most rows shown.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """The delivery log, newest first: status, attempts, last answer, next attempt."""
    with client() as grpo:
        rows = grpo.webhooks.deliveries(webhook_id, limit=limit).data
    columns = ["id", "type", "status", "attempts", "last", "next attempt", "delivered"]
    cells = [
        [
            d.id, d.event_type, d.status, d.attempts, d.last_status_code or d.last_error,
            d.next_attempt_at, d.delivered_at,
        ]
        for d in rows
    ]  # fmt: skip
    emit(rows, as_json, lambda _: out.print(table(columns, cells)))


@webhooks_app.command("test")
def test(webhook_id: HookArg, as_json: JsonOpt = False) -> None:
    """Queue a `webhook.test` delivery (then see `grpo webhooks deliveries`)."""
    with client() as grpo:
        queued = grpo.webhooks.test(webhook_id)
    emit(queued, as_json, lambda _: out.print(f"queued {queued.id}"))
