from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class WorkerHeartbeat(Base):
    """A running `grpo-service worker` (or `up`) and one queue it consumes, renewed every
    heartbeat: a queue whose rows are all stale has no live worker."""

    __tablename__ = "worker_heartbeats"

    worker_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    queue: Mapped[str] = mapped_column(String(100), primary_key=True, index=True)
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    devices: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # it owns
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
