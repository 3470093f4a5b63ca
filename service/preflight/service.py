"""Pre-flights (docs/preflight.md): a job spec checked as a submission is, then sampled and
scored on a worker of its queue; the API waits for the outcome a while, then lets the client
poll. A pre-flight creates no job and does not count toward the open-jobs limit (it has its
own, GRPO_PREFLIGHT_MAX_OPEN), but it spends device time: a tenant at or over its device-hour
budget is refused it as it is a job (402), and its run is metered (docs/usage.md)."""

from __future__ import annotations

import logging

import anyio
import anyio.to_thread
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.db import session_scope
from service.core.ids import new_id
from service.core.problems import not_found, too_many
from service.http.wakeups import wake_preflight
from service.jobs.schemas import JobCreate
from service.jobs.service import validate_submission
from service.models import PREFLIGHT_FINAL, Preflight
from service.preflight import rows
from service.settings import Settings
from service.storage import ObjectStorage
from service.usage import budget

log = logging.getLogger(__name__)
POLL_MAX_S = 1.0


def submit(
    session: Session, storage: ObjectStorage, settings: Settings, tenant_id: str, body: JobCreate
) -> Preflight:
    """Validate `body` exactly as POST /v1/jobs does, store the pre-flight and enqueue it.

    The row is committed here, not at the end of the request: the worker must see it while
    this request still waits for its outcome."""
    if rows.count_open(session, tenant_id, settings) >= settings.preflight_max_open:
        limit = settings.preflight_max_open
        raise too_many(f"{limit} pre-flights of this tenant are already under way", 5)
    submission = validate_submission(session, storage, settings, tenant_id, body)
    budget.refuse_over_budget(session, tenant_id)  # 402 after the 422s, as POST /v1/jobs
    estimate = submission.estimate
    row = Preflight(
        id=new_id("pf"),
        tenant_id=tenant_id,
        queue=body.queue,
        spec=submission.spec,
        base_model=submission.base.model.name,
        memory_estimate=estimate.as_dict() if estimate else None,
    )
    session.add(row)
    session.commit()
    wake_preflight(row.id, row.queue)  # a lost message is sent again by the reconciler
    return row


def get_preflight(
    session: Session, tenant_id: str, preflight_id: str, settings: Settings
) -> Preflight:
    """The tenant's pre-flight (another tenant's reads as missing), failed first if overdue."""
    row = session.scalar(
        select(Preflight).where(Preflight.id == preflight_id, Preflight.tenant_id == tenant_id)
    )
    if row is None:
        raise not_found("preflight", preflight_id)
    rows.expire_overdue(session, row, settings)
    return row


def _reread(tenant_id: str, preflight_id: str, settings: Settings) -> Preflight:
    # A short read of its own: the request's session has committed the row already.
    with session_scope() as session:
        row = get_preflight(session, tenant_id, preflight_id, settings)
        session.expunge(row)
    return row


async def wait_final(row: Preflight, settings: Settings) -> Preflight:
    """The row once final, or as it is after GRPO_PREFLIGHT_WAIT_S."""
    deadline = anyio.current_time() + settings.preflight_wait_s
    delay = 0.1
    while row.status not in PREFLIGHT_FINAL:
        left = deadline - anyio.current_time()
        if left <= 0:
            break
        await anyio.sleep(min(delay, left))
        delay = min(2 * delay, POLL_MAX_S)
        row = await anyio.to_thread.run_sync(_reread, row.tenant_id, row.id, settings)
    return row
