"""Pausing a job and resuming it: the transitions `queued -> paused`, `running -> pausing ->
paused` (at the run's next step boundary, through its checkpoint) and `paused -> queued`, with
the same fencing as the rest of the lifecycle (service/jobs/lifecycle.py; docs/lifecycle.md).
A tenant at or over its device-hour budget (`service.usage.budget`) has its running jobs
paused here too."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from service.jobs.lifecycle import WrongStatus, add_event
from service.models import Job
from service.models.base import utcnow
from service.usage.budget import budget_state


def request_pause(
    session: Session, job_id: str, reason: str, data: dict[str, Any] | None = None
) -> bool:
    """Pause the job: a queued one at once (`paused`: its broker message finds nothing to
    claim); a running one at its next step boundary (`pausing`: the run checkpoints, stops and
    calls `pause_attempt`). `reason` goes into the event (`requested by the API`, a budget's
    text). False when the job is in no status to pause (pausing, paused or final)."""
    for before, after, message in (
        ("queued", "paused", f"job paused: {reason}"),
        ("running", "pausing", f"pause requested: {reason}"),
    ):
        moved = session.scalar(
            update(Job)
            .where(Job.id == job_id, Job.status == before)
            .values(status=after)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        if moved is not None:
            add_event(session, job_id, "status", message,
                      {**(data or {}), "status": after, "reason": reason})  # fmt: skip
            return True
    return False


def pause_if_over_budget(session: Session, job_id: str, tenant_id: str) -> bool:
    """At a step boundary, once the step's usage is recorded: a running job of a tenant at or
    over its budget is asked to pause (it checkpoints at its next boundary and stops)."""
    state = budget_state(session, tenant_id)
    if state is None or not state.exhausted:
        return False
    reason = f"device-hour budget exhausted ({state.describe()})"
    return request_pause(session, job_id, reason, {"budget": state.as_dict()})


def pause_attempt(session: Session, job_id: str, epoch: int, step: int | None = None) -> bool:
    """The run asked to pause has checkpointed at a step boundary and stopped: `pausing` ->
    `paused`, only if this run still holds the job. The attempt it ends was asked to stop,
    not lost: it is not counted against `max_attempts`."""
    done = session.scalar(
        update(Job)
        .where(Job.id == job_id, Job.epoch == epoch, Job.status == "pausing")
        .values(status="paused", lease_until=None, attempts=Job.attempts - 1)
        .returning(Job.step)
        .execution_options(synchronize_session=False)
    )
    if done is None:
        return False
    at = done if step is None else step
    add_event(session, job_id, "status", f"job paused after step {at}",
              {"status": "paused", "epoch": epoch, "step": at})  # fmt: skip
    return True


def resume(session: Session, job: Job) -> Job:
    """A paused job is queued again (the caller enqueues it after the commit); its next claim
    resumes from its last committed checkpoint. WrongStatus for any other status."""
    moved = session.scalar(
        update(Job)
        .where(Job.id == job.id, Job.status == "paused")
        .values(status="queued", enqueued_at=utcnow())
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    )
    if moved is None:  # the status it has now, not the one read before (a race moved it on)
        session.refresh(job)
        raise WrongStatus(f"job '{job.id}' is {job.status}, not paused: only a paused job resumes")
    add_event(session, job.id, "status", "job resumed; queued", {"status": "queued"})
    session.refresh(job)
    return job
