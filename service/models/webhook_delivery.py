from datetime import datetime

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class WebhookDelivery(Base):
    """One message of the outbox: written in the transaction of the event it announces, sent
    (and retried) by the dispatcher until a 2xx or its attempts or age run out. The id is the
    `webhook-id` header, the same on every attempt; `body` is kept as sent, byte for byte.

    No foreign key to `webhooks`: a job's event write must never fail because its tenant
    deleted a webhook meanwhile; the dispatcher drops a delivery whose webhook is gone.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        # The dispatcher's claims: per webhook, is one due and which is due longest.
        Index("ix_webhook_deliveries_webhook_due", "webhook_id", "status", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(String(64), default=None)
    event_type: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_attempt_at: Mapped[datetime | None] = mapped_column(default=None)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
