from datetime import datetime

from sqlalchemy import Float, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Device-hours the tenant's jobs may use in all (`grpo-service tenants set-budget`); null:
    # no budget. Over it, new jobs answer 402 and running ones pause (docs/usage.md).
    budget_device_hours: Mapped[float | None] = mapped_column(Float, default=None)
