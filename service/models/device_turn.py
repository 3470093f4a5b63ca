from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class DeviceTurn(Base):
    """When a tenant's work (a job's attempt, an evaluation, a pre-flight) last took a device
    of a queue: the next free device goes to the tenant served longest ago
    (`service.training.turns`)."""

    __tablename__ = "device_turns"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    queue: Mapped[str] = mapped_column(String(64), primary_key=True)
    served_at: Mapped[datetime] = mapped_column(default=utcnow)
