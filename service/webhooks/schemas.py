from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.core.schemas import UtcDateTime
from service.webhooks.events import EventType

Subscription = Literal[EventType, "*"]  # one Literal: an error names the item alone


class WebhookCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "url": "https://example.com/hooks/grpo",
                    "events": ["job.succeeded", "job.failed", "job.checkpoint"],
                    "description": "training notifications",
                }
            ]
        },
    )

    url: str = Field(
        min_length=1,
        max_length=2000,
        description="Where deliveries are POSTed: https, a public address (unless the operator "
        "sets GRPO_WEBHOOK_ALLOW_PRIVATE).",
    )
    events: list[Subscription] = Field(
        min_length=1,
        max_length=20,
        description="Event types to deliver (`*` for all): job.queued, job.running, job.paused, "
        "job.succeeded, job.failed, job.cancelled, job.checkpoint, job.reward_hacking_suspected.",
    )
    description: str = Field("", max_length=500)


class WebhookOut(BaseModel):
    """A webhook; its secret is never returned after creation."""

    id: str
    url: str
    events: list[str]
    description: str
    created_at: UtcDateTime


class WebhookCreated(WebhookOut):
    secret: str | None = Field(
        description="`whsec_…`: the signing secret (Standard Webhooks), shown this once; null "
        "in a replay of the creation (same Idempotency-Key)."
    )


class DeliveryOut(BaseModel):
    """One message of the delivery log: its `id` is the `webhook-id` header of every attempt."""

    id: str
    event_type: str
    job_id: str | None
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None
    last_error: str | None
    last_attempt_at: UtcDateTime | None
    next_attempt_at: UtcDateTime | None = Field(description="Null once delivered or failed.")
    delivered_at: UtcDateTime | None
    created_at: UtcDateTime
