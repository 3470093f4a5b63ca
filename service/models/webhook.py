from datetime import datetime

from sqlalchemy import ForeignKey, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class Webhook(Base):
    """A tenant's subscription: job events of `events` are POSTed to `url`, signed with a
    secret that is shown once and stored encrypted (the dispatcher must sign with it)."""

    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list]
    description: Mapped[str] = mapped_column(String(500), default="")
    secret_ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
