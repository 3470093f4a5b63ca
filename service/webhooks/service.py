"""Webhooks: create (SSRF-checked, secret sealed), list, delete, the delivery log, test pings."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.core.problems import FieldError, ProblemError, invalid, not_found
from service.models import Webhook, WebhookDelivery
from service.models.base import utcnow
from service.secrets import crypto
from service.settings import Settings
from service.webhooks import outbox, signing, targets
from service.webhooks.events import TEST_EVENT
from service.webhooks.schemas import WebhookCreate


def secret_name(webhook_id: str) -> str:
    """The name the secret is sealed under: its ciphertext decrypts for this webhook only."""
    return f"webhook:{webhook_id}"


def find(session: Session, tenant_id: str, webhook_id: str) -> Webhook:
    row = session.scalar(
        select(Webhook).where(Webhook.id == webhook_id, Webhook.tenant_id == tenant_id)
    )
    if row is None:  # another tenant's webhook is just as missing
        raise not_found("webhook", webhook_id)
    return row


def create(
    session: Session, settings: Settings, tenant_id: str, body: WebhookCreate
) -> tuple[Webhook, str]:
    """The new webhook and its secret (returned this once)."""
    try:  # resolves the host: a name that points at a private address is refused here
        targets.resolve(body.url, settings.webhook_allow_private)
    except targets.TargetRefused as exc:
        raise invalid([FieldError(path="$.url", message=str(exc))]) from None
    count = session.scalar(select(func.count()).where(Webhook.tenant_id == tenant_id)) or 0
    if count >= settings.max_webhooks_per_tenant:  # a quota, not a rate: no Retry-After
        raise ProblemError(
            429,
            "Too Many Requests",
            f"you have {count} webhooks, the most a tenant may have "
            f"({settings.max_webhooks_per_tenant}): delete some (DELETE /v1/webhooks/{{id}})",
        )
    webhook_id, secret = new_id("wh"), signing.new_secret()
    try:
        sealed = crypto.encrypt(settings, tenant_id, secret_name(webhook_id), secret)
    except crypto.SecretsUnavailable as exc:
        raise ProblemError(503, "Service Unavailable", str(exc)) from None
    row = Webhook(
        id=webhook_id,
        tenant_id=tenant_id,
        url=body.url,
        events=list(dict.fromkeys(body.events)),
        description=body.description,
        secret_ciphertext=sealed,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row, secret


def remove(session: Session, webhook: Webhook) -> None:
    """The webhook and its delivery log; pending deliveries are never sent."""
    session.execute(
        delete(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == webhook.id)
        .execution_options(synchronize_session=False)
    )
    session.delete(webhook)
    session.flush()


def queue_test(session: Session, webhook: Webhook) -> WebhookDelivery:
    data = {"webhook_id": webhook.id, "message": "a test delivery"}
    row = outbox.delivery(webhook.id, webhook.tenant_id, TEST_EVENT, utcnow(), data)
    session.add(row)
    session.flush()
    return row
