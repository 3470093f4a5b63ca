from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class TinkerRun(Base):
    """A Tinker training run (the SDK's `model_id`): one LoRA adapter and its optimiser state on
    a catalog base model, held by the tinker worker serving that base."""

    __tablename__ = "tinker_runs"
    __table_args__ = (Index("ix_tinker_runs_tenant_id", "tenant_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    session_id: Mapped[str | None] = mapped_column(String(64), default=None)
    base_model: Mapped[str] = mapped_column(String(100))
    lora_rank: Mapped[int] = mapped_column(Integer)
    lora_config: Mapped[dict] = mapped_column(default=dict)  # workers.tinker.types.LoraConfig
    user_metadata: Mapped[dict | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_request_at: Mapped[datetime] = mapped_column(default=utcnow)
