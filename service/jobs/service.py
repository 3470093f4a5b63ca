"""Jobs: submission (references resolved and pinned), reads, cancellation, pause and resume."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from service.catalog.base_model import ResolvedBase, resolve_base
from service.core.db import after_commit, before_commit, rows_matched
from service.core.ids import new_id
from service.core.problems import FieldError, conflict, invalid, not_found
from service.datasets.service import find_dataset_by_reference
from service.environments.service import ENVIRONMENTS
from service.http.wakeups import wake_job_after_commit
from service.jobs import lifecycle, model_checks, open_jobs, pausing, queue_checks
from service.jobs.checkpoint_use import checkpoint_in_use
from service.jobs.field_checks import check_job_fields
from service.jobs.schemas import JobCreate, VerifierRef
from service.jobs.tracker_checks import check_trackers
from service.models import (
    UNFINISHED_STATUSES,
    Checkpoint,
    Dataset,
    Job,
    JobEvent,
    JobMetric,
)
from service.queues import worker_registry
from service.settings import Settings
from service.storage import ObjectStorage
from service.usage import budget
from service.verifiers.limits import Resolved, check_sandbox_caps, memoized
from service.verifiers.service import VERIFIERS, make_resolver
from workers.grpo.memory import MemoryEstimate

log = logging.getLogger(__name__)


def _pin_verifiers(
    session: Session,
    tenant_id: str,
    refs: list[VerifierRef],
    field: str,
    read: dict[tuple[str, int | None], Resolved],
) -> tuple[list[dict[str, Any]], list[FieldError]]:
    """Each reference's version (the latest when unset) and sha256; the versions read are
    added to `read` for the sandbox count, which then reads none again."""
    pinned, errors = [], []
    for i, ref in enumerate(refs):
        row = VERIFIERS.pin(session, tenant_id, ref.name, ref.version, f"$.{field}[{i}].name")
        if isinstance(row, FieldError):
            errors.append(row)
            continue
        read[(row.name, row.version)] = (row.version, row.kind, row.config)
        pinned.append(
            {"name": row.name, "version": row.version, "weight": ref.weight, "sha256": row.sha256}
        )
    return pinned, errors


def _pin_environment(
    session: Session, tenant_id: str, body: JobCreate
) -> tuple[dict[str, Any], list[FieldError]]:
    """`environment` with its version pinned (the latest when unset) and the version's sha256
    as `environment_sha256`: spec fields to store, or the error naming the reference."""
    env = body.environment
    if env is None:
        return {}, []
    row = ENVIRONMENTS.pin(session, tenant_id, env.name, env.version, "$.environment.name")
    if isinstance(row, FieldError):
        return {}, [row]
    stored = {**env.model_dump(mode="json"), "version": row.version}
    return {"environment": stored, "environment_sha256": row.sha256}, []


@dataclass
class Submission:
    """A submission that passed every check: the spec as stored (references pinned) and what
    was resolved on the way."""

    spec: dict[str, Any]
    base: ResolvedBase
    datasets: dict[str, Dataset]  # "dataset" (and "eval_dataset") -> its row
    estimate: MemoryEstimate | None


def validate_submission(
    session: Session, storage: ObjectStorage, settings: Settings, tenant_id: str, body: JobCreate
) -> Submission:
    """Resolve and pin every reference and check the spec against its model: a 422 naming every
    bad field, or the spec a job (or a pre-flight, `service.preflight`) runs."""
    base, base_error = resolve_base(session, tenant_id, body.base_model)
    errors = [base_error] if base_error else []
    datasets: dict[str, Dataset] = {}
    for field in ("dataset", "eval_dataset"):
        reference = getattr(body, field)
        if reference is None:
            continue
        row, why = find_dataset_by_reference(session, tenant_id, reference)
        if row is None:
            errors.append(FieldError(path=f"$.{field}", message=why or "no such dataset"))
        else:
            datasets[field] = row
    read: dict[tuple[str, int | None], Resolved] = {}
    verifiers, verifier_errors = _pin_verifiers(
        session, tenant_id, body.verifiers, "verifiers", read
    )
    if body.eval_verifiers is not None:
        eval_verifiers, eval_errors = _pin_verifiers(
            session, tenant_id, body.eval_verifiers, "eval_verifiers", read
        )
    else:  # defaults to the training verifiers: the same pins, no second round of lookups
        eval_verifiers, eval_errors = [dict(v) for v in verifiers], []
    environment, environment_errors = _pin_environment(session, tenant_id, body)
    errors += verifier_errors + eval_errors + environment_errors
    pinned = {"verifiers": verifiers} if not verifier_errors else {}
    if body.eval_verifiers is not None and not eval_errors:
        pinned["eval_verifiers"] = eval_verifiers
    resolve = memoized(make_resolver(session, tenant_id), read)
    errors += check_job_fields(storage, body, datasets, pinned, resolve)
    errors += model_checks.check_queue(body, settings)
    errors += queue_checks.check_devices(session, body, settings)
    errors += check_trackers(session, tenant_id, body, settings)
    errors += check_sandbox_caps(
        session,
        tenant_id,
        verifiers,
        eval_verifiers if body.eval_dataset else [],
        settings,
        environment=body.environment is not None,
        known=read,
    )
    estimate = None
    if base is not None:
        errors += model_checks.check_lora_targets(body, base.model)
        errors += model_checks.check_engine(body, base.model)
        errors += model_checks.check_prompts(body, base.model, datasets, storage)
        prompt_tokens = model_checks.longest_prompt(base.model, datasets)
        errors += model_checks.check_micro_batch_tokens(body, prompt_tokens)
        estimate, memory_errors = model_checks.check_memory(
            body, base.model, prompt_tokens, settings
        )
        errors += memory_errors
    if errors:
        raise invalid(errors)
    assert base is not None

    spec = body.model_dump(mode="json")
    for field, row in datasets.items():  # a name resolved: the spec keeps the id it named
        spec[field] = row.id
    spec.update(
        verifiers=verifiers,
        eval_verifiers=eval_verifiers,
        base_model_revision=base.model.revision,
        lineage=base.lineage,
        **environment,
    )
    return Submission(spec, base, datasets, estimate)


def create_job(
    session: Session, storage: ObjectStorage, settings: Settings, tenant_id: str, body: JobCreate
) -> Job:
    """Validate the submission, store the job (402 when the tenant's budget is spent, 429 when
    it has no open-jobs place left)."""
    submission = validate_submission(session, storage, settings, tenant_id, body)
    spec, base, datasets = submission.spec, submission.base, submission.datasets
    estimate = submission.estimate
    job = Job(
        id=new_id("job"),
        tenant_id=tenant_id,
        dataset_id=datasets["dataset"].id,
        eval_dataset_id=datasets["eval_dataset"].id if "eval_dataset" in datasets else None,
        spec=spec,
        total_steps=body.grpo.steps,
        queue=body.queue,
        devices=body.resources.devices,
        base_model=base.model.name,
        parent_checkpoint=base.parent.id if base.parent else None,
        memory_estimate=estimate.as_dict() if estimate else None,
    )
    unserved = worker_registry.queue_capacity(session, job.queue, settings) is None
    lifecycle.create(session, job, flush=False)
    if unserved:
        queue_checks.add_no_worker_event(session, job)
    session.flush()  # the job and its events in one flush
    before_commit(session, lambda: _take_open_job_place(session, tenant_id, settings))
    wake_job_after_commit(session, job.id, body.queue, job.devices)
    return job


def _take_open_job_place(session: Session, tenant_id: str, settings: Settings) -> None:
    """At the commit of a transaction that made a job live: under the tenant's lock, taken
    here so that it is held for these statements and the COMMIT alone, 402 when its budget is
    spent, 429 when its open jobs are over the limit (`service.jobs.open_jobs`)."""
    up_to = settings.max_open_jobs_per_tenant + 1  # this job and the limit's worth of others
    budget_hours, live = open_jobs.lock_and_count(session, tenant_id, up_to)
    budget.refuse_over_budget(session, tenant_id, budget_hours)
    open_jobs.refuse_over_limit(tenant_id, live, settings)


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


def pause_job(session: Session, job: Job) -> Job:
    """A queued job is paused at once; a running one checkpoints at its next step boundary."""
    paused = pausing.request_pause(session, job.id, "requested by the API")
    session.refresh(job)  # the status the UPDATE found, not the one read before it
    if not paused:
        raise conflict(f"job '{job.id}' is {job.status}: only a queued or running job pauses")
    return job


def resume_job(session: Session, settings: Settings, job: Job) -> Job:
    """A paused job is queued again, taking an open-jobs place (a paused one holds none)."""
    if job.status != "paused":
        raise conflict(f"job '{job.id}' is {job.status}, not paused: only a paused job resumes")
    try:
        pausing.resume(session, job)
    except lifecycle.WrongStatus as exc:  # moved on since we read it (a concurrent resume)
        raise conflict(str(exc)) from None
    tenant_id = job.tenant_id  # 402 at the commit: a budget's pause holds
    before_commit(session, lambda: _take_open_job_place(session, tenant_id, settings))
    queue, devices = job.queue, job.devices
    wake_job_after_commit(session, job.id, queue, devices)
    return job


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


def delete_checkpoint(session: Session, storage: ObjectStorage, job: Job, step: str) -> None:
    """Delete the checkpoint row, then (once that has committed) its archive. 409 while it is
    a live job's resume point or the base of a live job."""
    row = get_checkpoint(session, job, step)
    latest = session.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job.id))
    if job.status in UNFINISHED_STATUSES and row.step == latest:
        raise conflict(
            f"checkpoint {row.id} (step {row.step}) is the latest of live job '{job.id}': "
            "it resumes from it; cancel the job or wait until it has finished"
        )
    if checkpoint_in_use(session, row.id):
        raise conflict(
            f"checkpoint {row.id} (step {row.step}) is the base of a live job, or the fork "
            "point of one"
        )
    # A Core DELETE: a concurrent delete (the API, the worker's pruning) just finds no row.
    deleted = rows_matched(
        session.execute(
            delete(Checkpoint)
            .where(Checkpoint.id == row.id)
            .execution_options(synchronize_session=False)
        )
    )
    if not deleted:
        raise not_found("checkpoint", f"{job.id}@{step}")
    message = f"checkpoint at step {row.step} deleted"
    lifecycle.add_event(session, job.id, "checkpoint_deleted", message, {"step": row.step})
    session.flush()
    key = row.object_key
    after_commit(session, lambda: _delete_object(storage, key))


def _delete_object(storage: ObjectStorage, key: str) -> None:
    """After the row is gone: a failure here leaves an orphaned object, never a row without
    its archive, so it is logged rather than turned into an error after the commit."""
    try:
        storage.delete(key)
    except Exception:
        log.warning("could not delete checkpoint object %s", key, exc_info=True)
