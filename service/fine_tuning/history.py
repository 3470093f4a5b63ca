"""A fine-tuning job's events and checkpoints, newest first, paged by OpenAI's `after` (the
last id of the previous page)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.openai_ids import event_number, to_ours
from service.models import Checkpoint, Job, JobEvent, JobMetric


def list_events(
    session: Session, job: Job, after: str | None, limit: int
) -> tuple[list[JobEvent], bool]:
    stmt = select(JobEvent).where(JobEvent.job_id == job.id)
    if after is not None:
        number = event_number(after)
        if number is None:
            return [], False
        stmt = stmt.where(JobEvent.id < number)
    rows = list(session.scalars(stmt.order_by(JobEvent.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def list_checkpoints(
    session: Session, job: Job, after: str | None, limit: int
) -> tuple[list[tuple[Checkpoint, dict[str, Any] | None]], bool]:
    """Checkpoints with the metrics of their step."""
    stmt = select(Checkpoint).where(Checkpoint.job_id == job.id)
    if after is not None:
        ours = to_ours("ckpt", after)
        mine = (Checkpoint.id == ours, Checkpoint.job_id == job.id)
        step = session.scalar(select(Checkpoint.step).where(*mine)) if ours else None
        if step is None:
            return [], False
        stmt = stmt.where(Checkpoint.step < step)
    rows = list(session.scalars(stmt.order_by(Checkpoint.step.desc()).limit(limit + 1)))
    page = rows[:limit]
    metrics = {
        m.step: m.metrics
        for m in session.scalars(
            select(JobMetric).where(
                JobMetric.job_id == job.id, JobMetric.step.in_([c.step for c in page])
            )
        )
    }
    return [(c, metrics.get(c.step)) for c in page], len(rows) > limit
