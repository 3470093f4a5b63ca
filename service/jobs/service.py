"""Jobs: submission (references resolved and pinned), reads, cancellation."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.datasets.service import dataset_exists
from service.db import after_commit
from service.ids import new_id
from service.jobs import lifecycle
from service.jobs.schemas import JobCreate, VerifierRef
from service.models import (
    Checkpoint,
    Job,
    JobEvent,
    JobMetric,
)
from service.problems import FieldError, conflict, invalid, not_found
from service.verifiers.service import find_pin
from service.worker import enqueue_training

log = logging.getLogger(__name__)


def _pin_verifiers(
    session: Session, tenant_id: str, refs: list[VerifierRef], field: str
) -> tuple[list[dict[str, Any]], list[FieldError]]:
    pinned, errors = [], []
    for i, ref in enumerate(refs):
        row = find_pin(session, tenant_id, ref.name, ref.version)
        if row is None:
            label = ref.name if ref.version is None else f"{ref.name} version {ref.version}"
            errors.append(FieldError(path=f"$.{field}[{i}].name", message=f"no verifier {label}"))
            continue
        pinned.append(
            {"name": row.name, "version": row.version, "weight": ref.weight, "sha256": row.sha256}
        )
    return pinned, errors


def create_job(session: Session, tenant_id: str, body: JobCreate) -> Job:
    errors: list[FieldError] = []
    for field in ("dataset", "eval_dataset"):
        ident = getattr(body, field)
        if ident is not None and not dataset_exists(session, tenant_id, ident):
            errors.append(FieldError(path=f"$.{field}", message=f"no dataset '{ident}'"))
    verifiers, verifier_errors = _pin_verifiers(session, tenant_id, body.verifiers, "verifiers")
    if body.eval_verifiers is not None:
        eval_verifiers, eval_errors = _pin_verifiers(
            session, tenant_id, body.eval_verifiers, "eval_verifiers"
        )
    else:  # defaults to the training verifiers: the same pins, no second round of lookups
        eval_verifiers, eval_errors = [dict(v) for v in verifiers], []
    errors += verifier_errors + eval_errors
    if errors:
        raise invalid(errors)

    spec = body.model_dump(mode="json")
    spec.update(verifiers=verifiers, eval_verifiers=eval_verifiers)
    job = Job(
        id=new_id("job"),
        tenant_id=tenant_id,
        dataset_id=body.dataset,
        eval_dataset_id=body.eval_dataset,
        spec=spec,
        total_steps=body.grpo.steps,
        queue=body.queue,
    )
    lifecycle.create(session, job)
    after_commit(session, lambda: _wake_workers(job.id, body.queue))
    return job


def _wake_workers(job_id: str, queue: str) -> None:
    """Send the wake-up; if the broker is down, the committed row is enough: the reconciler
    enqueues queued jobs whose message never arrived."""
    try:
        enqueue_training(job_id, queue)
    except Exception:
        log.warning("could not enqueue job %s; the reconciler will retry", job_id, exc_info=True)


def get_job(session: Session, tenant_id: str, job_id: str) -> Job:
    job = session.scalar(select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id))
    if job is None:
        raise not_found("job", job_id)
    return job


def cancel_job(session: Session, job: Job) -> Job:
    """A queued job is cancelled at once; a running one is asked to stop at its next step."""
    try:
        return lifecycle.cancel(session, job)
    except lifecycle.AlreadyFinal as exc:
        raise conflict(str(exc)) from None


def list_metrics(session: Session, job: Job, after_step: int) -> list[dict[str, Any]]:
    rows = session.scalars(
        select(JobMetric)
        .where(JobMetric.job_id == job.id, JobMetric.step > after_step)
        .order_by(JobMetric.step)
    )
    return [{"step": r.step, **r.metrics} for r in rows]


def list_events(session: Session, job: Job, after: int, limit: int = 1000) -> list[JobEvent]:
    stmt = (
        select(JobEvent)
        .where(JobEvent.job_id == job.id, JobEvent.id > after)
        .order_by(JobEvent.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def list_checkpoints(session: Session, job: Job) -> list[Checkpoint]:
    return list(
        session.scalars(
            select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step)
        )
    )


def get_checkpoint(session: Session, job: Job, step: str) -> Checkpoint:
    stmt = select(Checkpoint).where(Checkpoint.job_id == job.id)
    if step == "latest":
        stmt = stmt.order_by(Checkpoint.step.desc()).limit(1)
    elif step.isdigit():
        stmt = stmt.where(Checkpoint.step == int(step))
    else:
        raise invalid([FieldError(path="path.step", message="a step number or 'latest'")])
    row = session.scalar(stmt)
    if row is None:
        raise not_found("checkpoint", f"{job.id}@{step}")
    return row
