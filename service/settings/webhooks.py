"""Webhooks (docs/webhooks.md): sent by the dispatcher beside every reconciler."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator


class WebhookSettings(BaseModel):
    """Which targets a webhook may name, how many a tenant keeps, and how deliveries retry."""

    webhook_allow_private: bool = Field(
        False,
        description="Allow webhook URLs over http and targets in loopback, private, "
        "link-local and other non-public ranges (refused by default: SSRF).",
    )
    max_webhooks_per_tenant: int = Field(
        20, ge=1, description="Webhooks a tenant may have (429 beyond: delete some)."
    )
    webhook_timeout_s: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="One delivery attempt's total deadline, from connecting to the "
        "answer's status line.",
    )
    webhook_connect_timeout_s: float = Field(
        2.0,
        gt=0,
        allow_inf_nan=False,
        description="Connecting to a receiver (TCP and TLS) must end within this; below "
        "GRPO_WEBHOOK_TIMEOUT_S, whose deadline then only cuts the wait for an answer.",
    )
    webhook_max_attempts: int = Field(
        10, ge=1, description="Attempts of one delivery before it is marked failed."
    )
    webhook_max_age_s: float = Field(
        24 * 3600.0,
        gt=0,
        allow_inf_nan=False,
        description="A delivery not delivered this long after its event is marked failed.",
    )
    webhook_retry_base_s: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="Delay before the first retry; doubled at each retry, with jitter.",
    )
    webhook_retry_max_s: float = Field(
        3600.0, gt=0, allow_inf_nan=False, description="Longest delay between two attempts."
    )
    webhook_poll_s: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="How often the dispatcher looks for due deliveries.",
    )
    webhook_concurrency: int = Field(
        8, ge=1, description="Deliveries one dispatcher sends at once."
    )
    webhook_target_concurrency: int = Field(
        2,
        ge=1,
        description="Deliveries of one webhook one dispatcher sends at once (its backlog or a "
        "slow receiver never takes every sender).",
    )
    webhook_tenant_concurrency: int = Field(
        4,
        ge=1,
        description="Deliveries of one tenant one dispatcher sends at once; senders are handed "
        "out in tenant turns, so one tenant's slow receivers never hold another's deliveries.",
    )

    @model_validator(mode="after")
    def _connect_within_the_deadline(self) -> Self:
        if self.webhook_connect_timeout_s >= self.webhook_timeout_s:
            raise ValueError(
                "GRPO_WEBHOOK_CONNECT_TIMEOUT_S must be below GRPO_WEBHOOK_TIMEOUT_S (connecting "
                "is one part of the attempt's deadline)"
            )
        return self
