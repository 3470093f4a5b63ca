"""The outbox: one delivery row per matching webhook, added in the very flush (so the very
transaction) that adds the job event it announces. A crash loses nothing that was committed,
and nothing is announced that was rolled back.

Importing this module registers a `before_flush` listener on every Session of the process.
`service.jobs.lifecycle`, through which every job event is written (API, worker, training
process, reconciler), imports it, so each process that writes events announces them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, event, select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.models import Job, JobEvent, Webhook, WebhookDelivery
from service.models.base import utcnow
from service.webhooks.events import subscribed, webhook_type


def _rfc3339(value: datetime) -> str:
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def body(type_: str, at: datetime, data: dict[str, Any]) -> str:
    """The delivery's body, serialised once: every attempt sends (and signs) these bytes."""
    payload = {"type": type_, "timestamp": _rfc3339(at), "data": data}
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def delivery(
    webhook_id: str, tenant_id: str, type_: str, at: datetime, data: dict[str, Any],
    job_id: str | None = None,
) -> WebhookDelivery:  # fmt: skip
    return WebhookDelivery(
        id=new_id("msg"), webhook_id=webhook_id, tenant_id=tenant_id, job_id=job_id,
        event_type=type_, body=body(type_, at, data), status="pending", attempts=0,
        next_attempt_at=utcnow(), created_at=utcnow(),
    )  # fmt: skip


def _tenants(session: Session, job_ids: set[str]) -> dict[str, str]:
    """Job id -> tenant id; a job created in this flush is not in the database yet."""
    found = {o.id: o.tenant_id for o in session.new if isinstance(o, Job) and o.id in job_ids}
    if missing := job_ids - found.keys():
        rows = session.execute(select(Job.id, Job.tenant_id).where(Job.id.in_(missing)))
        found.update({job_id: tenant_id for job_id, tenant_id in rows})
    return found


# Built once, with a bound parameter: every flush that adds a job event runs it.
_HOOKS = select(Webhook.id, Webhook.tenant_id, Webhook.events).where(
    Webhook.tenant_id.in_(bindparam("tenants", expanding=True))
)


@event.listens_for(Session, "before_flush")
def _announce(session: Session, _context: Any, _instances: Any) -> None:
    # An event is in `session.new` for one flush only: a failed flush rolls back both it and
    # the deliveries added here.
    pending = [
        (obj, type_)
        for obj in session.new
        if isinstance(obj, JobEvent) and (type_ := webhook_type(obj.type, obj.data or {}))
    ]
    if not pending:
        return
    tenants = _tenants(session, {e.job_id for e, _ in pending})
    hooks = session.execute(_HOOKS, {"tenants": list(set(tenants.values()))}).all()
    for job_event, type_ in pending:
        tenant_id = tenants.get(job_event.job_id)
        matching = [h for h in hooks if h.tenant_id == tenant_id and subscribed(h.events, type_)]
        if not matching:
            continue
        if job_event.at is None:  # the event's own time, so the body's timestamp equals it
            job_event.at = utcnow()
        data = {**(job_event.data or {}), "job_id": job_event.job_id, "message": job_event.message}
        for hook in matching:
            session.add(
                delivery(hook.id, hook.tenant_id, type_, job_event.at, data, job_event.job_id)
            )
