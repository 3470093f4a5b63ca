"""Webhooks from the client: `client.webhooks.create(url, events)` (its secret, once), list,
get, delete, the delivery log, a test delivery."""

from __future__ import annotations

from collections.abc import Sequence

from grpo_client.models import Page
from grpo_client.models_generated import DeliveryOut, WebhookCreated, WebhookOut
from grpo_client.transport import Transport

__all__ = ["DeliveryOut", "WebhookCreated", "WebhookOut", "Webhooks"]


class Webhooks:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self,
        url: str,
        events: Sequence[str] = ("*",),
        description: str = "",
        *,
        idempotency_key: str | None = None,
    ) -> WebhookCreated:
        """Subscribe `url`; the answer's `secret` (`whsec_…`) is shown this once."""
        body = {"url": url, "events": list(events), "description": description}
        data = self._t.json(
            "POST", "/v1/webhooks", json=body, creates=True, idempotency_key=idempotency_key
        )
        return WebhookCreated.model_validate(data)

    def list(self, *, limit: int = 20, after: str | None = None) -> Page[WebhookOut]:
        params = {"limit": limit, **({"after": after} if after else {})}
        page = Page[WebhookOut].model_validate(self._t.json("GET", "/v1/webhooks", params=params))
        return page.with_fetcher(lambda nxt: self.list(limit=limit, after=nxt))

    def get(self, webhook_id: str) -> WebhookOut:
        return WebhookOut.model_validate(self._t.json("GET", f"/v1/webhooks/{webhook_id}"))

    def delete(self, webhook_id: str) -> None:
        self._t.request("DELETE", f"/v1/webhooks/{webhook_id}")

    def deliveries(
        self, webhook_id: str, *, limit: int = 20, after: str | None = None
    ) -> Page[DeliveryOut]:
        """The delivery log, newest first (iterating walks every page)."""
        params = {"limit": limit, **({"after": after} if after else {})}
        data = self._t.json("GET", f"/v1/webhooks/{webhook_id}/deliveries", params=params)
        page = Page[DeliveryOut].model_validate(data)
        return page.with_fetcher(lambda nxt: self.deliveries(webhook_id, limit=limit, after=nxt))

    def test(self, webhook_id: str) -> DeliveryOut:
        """Queue a `webhook.test` delivery."""
        return DeliveryOut.model_validate(self._t.json("POST", f"/v1/webhooks/{webhook_id}/test"))
