"""A fine-tuning job's `trained_tokens` and `estimated_finish`, from our job's own records:
the tokens its recorded steps trained (the usage records, `service.training.usage`: a step redone
after a resume counted once) and, while it runs, its remaining steps at the mean time of its
last steps (`step_seconds` of the step metrics)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Job, JobMetric, JobUsage

RECENT_STEPS = 10  # the steps whose mean time paces the estimate


@dataclass(frozen=True)
class Progress:
    trained_tokens: int | None = None  # None before any step was recorded
    estimated_finish: int | None = None  # Unix seconds; None unless running with a step done


def progress_of(session: Session, jobs: Iterable[Job]) -> dict[str, Progress]:
    """Each job's progress by id, in two queries for any number of jobs (a listed page)."""
    jobs = list(jobs)
    if not jobs:
        return {}
    summed = session.execute(
        select(JobUsage.job_id, func.sum(JobUsage.trained_tokens))
        .where(JobUsage.job_id.in_([j.id for j in jobs]))
        .group_by(JobUsage.job_id)
    )
    tokens = {job_id: total for job_id, total in summed}
    now = time.time()
    return {
        j.id: Progress(
            trained_tokens=int(tokens[j.id]) if tokens.get(j.id) is not None else None,
            estimated_finish=_estimated_finish(session, j, now),
        )
        for j in jobs
    }


def _estimated_finish(session: Session, job: Job, now: float) -> int | None:
    """Now plus the remaining steps times the mean `step_seconds` of the last ones; None for a
    job not running (queued, winding down, paused or final) or with no step timed yet."""
    if job.status != "running":
        return None
    remaining = max(0, job.total_steps - job.step)
    rows = session.scalars(
        select(JobMetric.metrics)
        .where(JobMetric.job_id == job.id)
        .order_by(JobMetric.step.desc())
        .limit(RECENT_STEPS)
    )
    times = [
        float(s)
        for m in rows
        if isinstance(s := (m or {}).get("step_seconds"), int | float)
        and not isinstance(s, bool)
        and math.isfinite(s)
        and s >= 0
    ]
    if not times:
        return None
    return round(now + remaining * sum(times) / len(times))
