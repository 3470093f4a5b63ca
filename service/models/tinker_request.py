from datetime import datetime

from sqlalchemy import Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow

# What a request whose lease lapsed answers (service.core.leases.fail_lapsed).
LEASE_LAPSED = {
    "error": "the tinker worker running this request stopped renewing its lease (it died, hung "
    "or lost the database) before it finished: the request was failed and will not run again; "
    "its run's unsaved state may be lost with that worker (load_state from a checkpoint)",
    "category": "server",
}


class TinkerRequest(Base):
    """One Tinker request (a future, the SDK's `request_id`): queued by the API, claimed and
    executed by a tinker worker (`grpo-service tinker-worker`), read back by retrieve_future.
    `seq` orders the queue: a tenant's requests run oldest first, tenants take turns weighted
    by their recent `device_seconds`.

    Claimed under a lease as a job is (service/core/leases.py): `epoch` the claim's fencing
    token, `lease_until` renewed by the worker while the request runs. A request whose lease
    lapsed is failed, never claimed again (`futures.fail_lapsed`)."""

    __tablename__ = "tinker_requests"
    __table_args__ = (
        Index("ix_tinker_requests_status_seq", "status", "seq"),
        Index("ix_tinker_requests_tenant_id", "tenant_id"),
        # the claim's cost of a tenant's recent requests (service/tinker/futures.claim_next)
        Index("ix_tinker_requests_tenant_id_finished_at", "tenant_id", "finished_at"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    run_id: Mapped[str | None] = mapped_column(String(64), default=None)  # None: base sampling
    base_model: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(32))  # forward_backward, optim_step, sample, ...
    payload: Mapped[dict] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="queued")  # running, done, failed
    result: Mapped[dict | None] = mapped_column(default=None)
    error: Mapped[dict | None] = mapped_column(default=None)  # {"error", "category"}
    device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)  # who claimed it
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
