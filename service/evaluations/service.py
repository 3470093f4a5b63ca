"""Evaluations, API side: submission (references resolved and pinned, limits checked), reads,
the samples' pages and cancellation. The run itself is `service.training.evaluation_run`."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.catalog.base_model import ResolvedBase, resolve_base
from service.catalog.fine_tuned import PREFIX as FINE_TUNED_PREFIX
from service.catalog.fine_tuned import find_fine_tuned
from service.core.ids import new_id
from service.core.pagination import PageParams, paginate
from service.core.problems import FieldError, conflict, invalid, not_found, too_many
from service.datasets.service import find_dataset_by_reference
from service.evaluations import rows
from service.evaluations.schemas import EvaluationCreate
from service.http.wakeups import wake_evaluation_after_commit
from service.jobs import open_jobs
from service.jobs.field_checks import FieldUse, check_verifier_fields
from service.jobs.model_checks import check_queue
from service.models import Dataset, Evaluation, EvaluationSample, Job
from service.models.base import utcnow
from service.settings import Settings
from service.storage import ObjectStorage
from service.usage import budget
from service.verifiers.service import VERIFIERS, make_resolver
from workers.grpo.config import GenerationParams

log = logging.getLogger(__name__)


def _resolve_model(
    session: Session, tenant_id: str, model: str
) -> tuple[ResolvedBase | None, FieldError | None]:
    """As a job's base_model, and a fine-tuned model's name stands for its final checkpoint;
    another tenant's checkpoint or model reads exactly like a missing one."""
    reference = model
    if model.startswith(FINE_TUNED_PREFIX):
        found = find_fine_tuned(session, tenant_id, model)
        if found is not None:
            reference = found[0].id
    base, error = resolve_base(session, tenant_id, reference)
    if error is not None:
        message = error.message.replace(repr(reference), repr(model))
        error = FieldError(path="$.model", message=message)
    return base, error


def _check_size(
    body: EvaluationCreate, dataset: Dataset, settings: Settings
) -> tuple[int, list[FieldError]]:
    """Records to evaluate, or the error naming the field over GRPO_EVAL_MAX_RECORDS."""
    limit = settings.eval_max_records
    if body.max_records is not None and body.max_records > limit:
        message = f"at most {limit} records per evaluation (GRPO_EVAL_MAX_RECORDS)"
        return 0, [FieldError(path="$.max_records", message=message)]
    count = min(dataset.num_records, body.max_records or dataset.num_records)
    if count > limit:
        message = (
            f"{dataset.id} has {dataset.num_records} records; an evaluation takes at most "
            f"{limit} (GRPO_EVAL_MAX_RECORDS): set max_records"
        )
        return 0, [FieldError(path="$.dataset", message=message)]
    return count, []


def _generation(session: Session, body: EvaluationCreate, base: ResolvedBase) -> dict[str, Any]:
    """The sampling settings: the body's, else the job's own for one of its checkpoints (the
    settings it was trained to answer with), else the defaults."""
    if body.generation is not None:
        return body.generation.model_dump(mode="json")
    job = session.get(Job, base.parent.job_id) if base.parent is not None else None
    trained = job.spec.get("generation") if job is not None else None
    return GenerationParams.model_validate(trained or {}).model_dump(mode="json")


def validate(
    session: Session,
    storage: ObjectStorage,
    settings: Settings,
    tenant_id: str,
    body: EvaluationCreate,
) -> tuple[dict[str, Any], ResolvedBase]:
    """Every reference resolved and pinned: the spec the worker runs, or a 422 naming every
    bad field."""
    base, error = _resolve_model(session, tenant_id, body.model)
    errors = [error] if error else []
    dataset, why = find_dataset_by_reference(session, tenant_id, body.dataset)
    records = 0
    if dataset is None:
        errors.append(FieldError(path="$.dataset", message=why or "no such dataset"))
    else:
        records, size_errors = _check_size(body, dataset, settings)
        errors += size_errors
    pinned = []
    for i, ref in enumerate(body.verifiers):
        row = VERIFIERS.pin(session, tenant_id, ref.name, ref.version, f"$.verifiers[{i}].name")
        if isinstance(row, FieldError):
            errors.append(row)
        else:
            pinned.append(
                {"name": row.name, "version": row.version, "weight": ref.weight,
                 "sha256": row.sha256}
            )  # fmt: skip
    if dataset is not None and len(pinned) == len(body.verifiers):  # every reference pinned
        uses = [FieldUse("verifiers", pinned, dataset)]
        errors += check_verifier_fields(storage, uses, make_resolver(session, tenant_id))
    errors += check_queue(body, settings)  # type: ignore[arg-type]  # reads `queue` only
    if errors:
        raise invalid(errors)
    assert base is not None and dataset is not None
    spec = body.model_dump(mode="json")
    spec.update(
        generation=_generation(session, body, base),
        dataset=dataset.id,
        verifiers=pinned,
        records=records,
        base_model=body.model,  # the name the weights are known by (service.training.weights)
        base_model_revision=base.model.revision,
        lineage=base.lineage,
    )
    return spec, base


def submit(
    session: Session,
    storage: ObjectStorage,
    settings: Settings,
    tenant_id: str,
    body: EvaluationCreate,
) -> Evaluation:
    spec, base = validate(session, storage, settings, tenant_id, body)
    budget.refuse_over_budget(session, tenant_id)  # 402 after the 422s, as POST /v1/jobs
    refuse_too_many_open(session, settings, tenant_id)
    row = Evaluation(
        id=new_id("eval"),
        tenant_id=tenant_id,
        status="queued",
        queue=body.queue,
        model=body.model,
        base_model=base.model.name,
        spec=spec,
        enqueued_at=utcnow(),
    )
    session.add(row)
    session.flush()
    wake_evaluation_after_commit(session, row.id, row.queue)
    return row


def refuse_too_many_open(session: Session, settings: Settings, tenant_id: str) -> None:
    """429 with Retry-After when the tenant has GRPO_EVAL_MAX_OPEN_PER_TENANT evaluations
    queued, running or cancelling, counted under the tenant's submission lock (exact under
    concurrent submissions, as the open-jobs limit)."""
    open_jobs.lock_tenant(session, tenant_id)
    held = session.scalar(
        select(func.count()).where(
            Evaluation.tenant_id == tenant_id, Evaluation.status.in_(rows.OPEN)
        )
    )
    limit = settings.eval_max_open_per_tenant
    if (held or 0) >= limit:
        raise too_many(
            f"the tenant has {limit} open evaluations; the limit is {limit}",
            settings.eval_open_retry_after_s,
        )


def get_evaluation(session: Session, tenant_id: str, evaluation_id: str) -> Evaluation:
    """The tenant's evaluation; another tenant's answers exactly as a missing one."""
    row = session.scalar(
        select(Evaluation).where(Evaluation.id == evaluation_id, Evaluation.tenant_id == tenant_id)
    )
    if row is None:
        raise not_found("evaluation", evaluation_id)
    return row


def list_evaluations(
    session: Session, tenant_id: str, page: PageParams
) -> tuple[list[Evaluation], bool, str | None]:
    stmt = select(Evaluation).where(Evaluation.tenant_id == tenant_id)
    return paginate(session, stmt, Evaluation.id, page)


def cancel(session: Session, row: Evaluation) -> Evaluation:
    if not rows.cancel(session, row):
        raise conflict(f"evaluation {row.id} is {row.status}: there is nothing to cancel")
    return row


def list_samples(
    session: Session, row: Evaluation, page: PageParams
) -> tuple[list[EvaluationSample], bool, str | None]:
    """Samples in order (record by record); `after` is the last index of the previous page."""
    stmt = select(EvaluationSample).where(EvaluationSample.evaluation_id == row.id)
    if page.after is not None:
        if not page.after.isdigit() or len(page.after) > 9:
            message = "must be a sample index (the `next` of the previous page)"
            raise invalid([FieldError(path="query.after", message=message)])
        stmt = stmt.where(EvaluationSample.index > int(page.after))
    found = list(session.scalars(stmt.order_by(EvaluationSample.index).limit(page.limit + 1)))
    has_more = len(found) > page.limit
    found = found[: page.limit]
    return found, has_more, (str(found[-1].index) if has_more and found else None)
