"""Turns on a device queue between tenants, across every kind of run (a job's attempt, an
evaluation, a pre-flight; docs/reliability.md#turns-between-tenants).

A Celery message names one row, but what it really says is that one run's worth of work waits
on its queue: the worker that takes it runs the queued row whose turn it is (`order`), which
may be another tenant's, or another kind. The turn goes to the tenant whose work took a device
of the queue longest ago (`DeviceTurn`, written at each claim: `mark_served`; a tenant never
served goes first), and within a tenant to its oldest row. One message is sent per queued row
(and the reconciler sends again those whose message was lost), so every row gets a message's
worth of device; a message whose own row already ran under another takes the next turn, or
finds nothing left and ends. So a tenant that queues a hundred runs delays another tenant's
next run by at most one run per device, whatever the kinds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from service.models import DeviceTurn, Evaluation, Job, Preflight
from service.models.base import aware, utcnow

CANDIDATES = 256  # queued rows looked at per kind, oldest first: enough to find every tenant
NEVER = datetime.min.replace(tzinfo=UTC)
TABLES: dict[str, Any] = {"job": Job, "evaluation": Evaluation, "pre-flight": Preflight}


def where(session: Session, kind: str, row_id: str) -> tuple[str, int] | None:
    """The queue and device count a row's message was sent for; None when it is gone."""
    model = TABLES[kind]
    devices = model.devices if model is Job else literal(1)  # the others take one device
    found = session.execute(select(model.queue, devices).where(model.id == row_id)).first()
    return None if found is None else (found[0], int(found[1]))


def order(session: Session, queue: str, devices: int) -> list[tuple[str, str]]:
    """The queued rows of `queue` (runs of `devices` devices), as (kind, id), in turn order."""
    queued: list[tuple[str, str, str, datetime]] = []
    for kind, model in TABLES.items():
        if devices != 1 and model is not Job:
            continue  # evaluations and pre-flights take one device
        since = func.coalesce(model.enqueued_at, model.created_at)
        stmt = select(model.id, model.tenant_id, since).where(
            model.status == "queued", model.queue == queue
        )
        if model is Job:
            stmt = stmt.where(Job.devices == devices)
        stmt = stmt.order_by(since).limit(CANDIDATES)
        queued += [
            (kind, row_id, tenant, aware(at)) for row_id, tenant, at in session.execute(stmt)
        ]
    tenants = {tenant for _, _, tenant, _ in queued}
    served = {
        tenant: aware(at)
        for tenant, at in session.execute(
            select(DeviceTurn.tenant_id, DeviceTurn.served_at).where(
                DeviceTurn.queue == queue, DeviceTurn.tenant_id.in_(tenants)
            )
        )
    }
    queued.sort(key=lambda r: (served.get(r[2], NEVER), r[3]))
    return [(kind, row_id) for kind, row_id, _, _ in queued]


def mark_served(session: Session, tenant_id: str, queue: str) -> None:
    """The tenant's work just took a device of `queue`: its next turn comes after the others'."""
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    now = utcnow()
    session.execute(
        insert(DeviceTurn)
        .values(tenant_id=tenant_id, queue=queue, served_at=now)
        .on_conflict_do_update(index_elements=["tenant_id", "queue"], set_={"served_at": now})
    )
