"""OpenAI fine-tuning jobs as our jobs: `POST /v1/fine_tuning/jobs` validates the OpenAI
request, registers its grader as an `openai_grader` verifier, maps its hyperparameters onto
GRPO knobs and submits one of our jobs (`service.jobs.service.create_job`, every check of
POST /v1/jobs included). The job row is the one source of truth; `jobs.fine_tuning` keeps the
OpenAI request for the fine_tuning.job view (`views`)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.catalog.base_model import CHECKPOINT_PREFIX
from service.catalog.fine_tuned import PREFIX as FINE_TUNED_PREFIX
from service.catalog.fine_tuned import find_fine_tuned
from service.catalog.service import find_model, find_tenant_checkpoint
from service.core.openai_ids import to_openai, to_ours
from service.core.pagination import PageParams, paginate
from service.core.problems import FieldError, ProblemError, invalid, model_not_found, not_found
from service.core.pydantic_errors import field_errors
from service.datasets.service import find_dataset
from service.files.service import find_file
from service.fine_tuning import hyperparameters
from service.fine_tuning.grader_fields import item_fields, missing_fields
from service.fine_tuning.schemas import FineTuningJobCreate, ReinforcementMethod
from service.graders.service import validate_grader
from service.jobs import service as jobs
from service.jobs.schemas import JobCreate
from service.models import Dataset, Job
from service.registry.service import config_sha256
from service.settings import Settings
from service.storage import ObjectStorage
from service.verifiers.schemas import VerifierCreate
from service.verifiers.service import VERIFIERS
from workers.verifiers.grader_kind import KIND as GRADER_KIND

GRADER_PATH = "$.method.reinforcement.grader"
ONLY_REINFORCEMENT = (
    "only reinforcement fine-tuning is trained here (GRPO): send method {type: "
    "'reinforcement', reinforcement: {grader, hyperparameters}}; supervised and dpo are not"
)


def bad_request(errors: list[FieldError], detail: str | None = None) -> ProblemError:
    detail = detail or "; ".join(f"{e.path}: {e.message}" for e in errors)
    return ProblemError(400, "Bad Request", detail, errors=errors)


def _method(body: FineTuningJobCreate) -> ReinforcementMethod:
    errors = []
    if body.method is None:
        errors.append(FieldError(path="$.method", message=f"required: {ONLY_REINFORCEMENT}"))
    elif body.method.type != "reinforcement":
        message = f"{body.method.type!r}: {ONLY_REINFORCEMENT}"
        errors.append(FieldError(path="$.method.type", message=message))
    elif body.method.reinforcement is None:
        message = "required: {grader, hyperparameters}"
        errors.append(FieldError(path="$.method.reinforcement", message=message))
    if body.hyperparameters:
        message = "set them in method.reinforcement.hyperparameters"
        errors.append(FieldError(path="$.hyperparameters", message=message))
    if body.integrations:
        message = "not supported: our jobs report to trackers (POST /v1/jobs report_to)"
        errors.append(FieldError(path="$.integrations", message=message))
    if errors:
        raise bad_request(errors)
    assert body.method is not None and body.method.reinforcement is not None
    return body.method.reinforcement


def _repath(exc: ProblemError, paths: dict[str, str], status: int | None = None) -> ProblemError:
    """The problem with its field paths as the OpenAI request names them."""

    def move(path: str) -> str:
        for ours, theirs in paths.items():
            if path == ours or path.startswith((ours + ".", ours + "[")):
                return theirs + path[len(ours) :]
        return path

    problem = exc.problem
    errors = [FieldError(path=move(e.path), message=e.message) for e in problem.errors or []]
    detail = problem.detail
    for ours, theirs in paths.items():
        detail = detail.replace(ours, theirs)
    status = status or problem.status
    title = "Bad Request" if status == 400 else problem.title
    return ProblemError(status, title, detail, errors=errors or None, headers=exc.headers)


def _grader(
    session: Session, settings: Settings, tenant_id: str, grader: dict[str, Any]
) -> dict[str, Any]:
    """The normalised grader; any fault of it is a 400 at creation, naming the field."""
    try:
        return validate_grader(session, settings, tenant_id, grader)
    except ProblemError as exc:
        raise _repath(exc, {"$.grader": GRADER_PATH}, status=400) from None


def _find_file(session: Session, tenant_id: str, reference: str) -> Dataset | None:
    if reference.startswith("ds_"):
        return find_dataset(session, tenant_id, reference)
    return find_file(session, tenant_id, reference)


def _files(
    session: Session, tenant_id: str, body: FineTuningJobCreate
) -> tuple[Dataset, Dataset | None]:
    found: dict[str, Dataset | None] = {}
    errors = []
    for field in ("training_file", "validation_file"):
        reference = getattr(body, field)
        if reference is None:
            continue
        found[field] = row = _find_file(session, tenant_id, reference)
        if row is None:
            message = f"no file {reference!r} of yours (POST /v1/files uploads one)"
            errors.append(FieldError(path=f"$.{field}", message=message))
    if errors:
        raise bad_request(errors)
    training = found["training_file"]
    assert training is not None
    return training, found.get("validation_file")


def _grader_verifier(
    session: Session, tenant_id: str, grader: dict[str, Any], settings: Settings
) -> str:
    """The verifier scoring with `grader`: named by its content, so the same grader on the
    next job reuses the same version (and its metrics trace to one sha256)."""
    sha = config_sha256(GRADER_KIND, grader)
    name = f"rft-grader-{sha[:16]}"
    latest = VERIFIERS.find(session, tenant_id, name)
    if latest is None or latest.sha256 != sha:
        description = f"The grader of a fine-tuning job ({grader['type']} {grader['name']!r})"
        create = VerifierCreate(name=name, kind=GRADER_KIND, description=description, config=grader)
        VERIFIERS.create(session, tenant_id, create, settings)
    return name


def _base_model(session: Session, tenant_id: str, model: str) -> str:
    """A fine-tuned model (`ft:…`) trains on from its final checkpoint. A model the tenant has
    none of is OpenAI's 400 `model_not_found` (param `model`: the SDK's BadRequestError), not
    the 422 of POST /v1/jobs, whose `base_model` refusal it would otherwise become."""
    base = model
    if model.startswith(FINE_TUNED_PREFIX):
        found = find_fine_tuned(session, tenant_id, model)
        base = found[0].id if found is not None else model
    if base.startswith(CHECKPOINT_PREFIX):  # another tenant's reads exactly like a missing one
        known = find_tenant_checkpoint(session, tenant_id, base) is not None
    else:
        known = find_model(session, base) is not None
    if not known:
        missing = model_not_found(model).problem
        kind = "model-not-found"
        raise ProblemError(400, "Bad Request", missing.detail, errors=missing.errors, kind=kind)
    return base


def create_job(
    session: Session,
    storage: ObjectStorage,
    settings: Settings,
    tenant_id: str,
    body: FineTuningJobCreate,
) -> Job:
    method = _method(body)
    base_model = _base_model(session, tenant_id, body.model)
    grader = _grader(session, settings, tenant_id, method.grader)
    training, validation = _files(session, tenant_id, body)
    reads = item_fields(grader, GRADER_PATH)
    errors = missing_fields(reads, training, "training_file", storage)
    if validation is not None:
        errors += missing_fields(reads, validation, "validation_file", storage)
    if errors:
        raise bad_request(errors)
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    shown, grpo, cadence = hyperparameters.resolve(method.hyperparameters, training.num_records)
    spec: dict[str, Any] = {
        "base_model": base_model,
        "dataset": training.id,
        "verifiers": [{"name": _grader_verifier(session, tenant_id, grader, settings)}],
        "grpo": {**grpo, "seed": seed},
        **cadence,
    }
    extras: dict[str, Any] = {
        "name": body.suffix,
        "eval_dataset": validation.id if validation else None,
    }
    extras |= {"generation": body.generation, "lora": body.lora, "queue": body.queue}
    spec |= {k: v for k, v in extras.items() if v is not None}
    try:
        job_body = JobCreate.model_validate(spec)
    except ValidationError as exc:  # a mapped knob out of range (the knobs' own bounds)
        problem = invalid(field_errors(exc.errors(), JobCreate))
        raise _repath(problem, hyperparameters.KNOB_PATHS) from None
    try:
        job = jobs.create_job(session, storage, settings, tenant_id, job_body)
    except ProblemError as exc:
        raise _repath(exc, hyperparameters.KNOB_PATHS) from None
    job.fine_tuning = {
        "model": body.model,
        "training_file": to_openai("file", training.id),
        "validation_file": to_openai("file", validation.id) if validation else None,
        "suffix": body.suffix,
        "seed": seed,
        "metadata": body.metadata,
        "method": {
            "type": "reinforcement",
            "reinforcement": {"grader": grader, "hyperparameters": shown},
        },
    }
    session.flush()
    return job


def find_job(session: Session, tenant_id: str, job_id: str) -> Job | None:
    """The tenant's fine-tuning job by `ftjob-…` (or our `job_…`); None as for a missing id."""
    ours = to_ours("job", job_id) or (job_id if job_id.startswith("job_") else None)
    if ours is None:
        return None
    return session.scalar(
        select(Job).where(Job.id == ours, Job.tenant_id == tenant_id, Job.fine_tuning.is_not(None))
    )


def get_job(session: Session, tenant_id: str, job_id: str) -> Job:
    job = find_job(session, tenant_id, job_id)
    if job is None:
        raise not_found("fine_tuning.job", job_id)
    return job


@contextmanager
def named_as_openai(job: Job) -> Iterator[None]:
    """A refusal of an operation on `job` (a 409 from service.jobs) names it as the caller
    does, `ftjob-…`, not by our `job_…` id."""
    try:
        yield
    except ProblemError as exc:
        ours, theirs = job.id, to_openai("job", job.id)
        problem = exc.problem
        errors = [e.model_copy(update={"message": e.message.replace(ours, theirs)})
                  for e in problem.errors or []]  # fmt: skip
        update = {"detail": problem.detail.replace(ours, theirs), "errors": errors or None}
        exc.problem = problem.model_copy(update=update)
        raise


def list_jobs(
    session: Session, tenant_id: str, page: PageParams
) -> tuple[list[Job], bool, str | None]:
    stmt = select(Job).where(Job.tenant_id == tenant_id, Job.fine_tuning.is_not(None))
    if page.after is not None:
        after = to_ours("job", page.after)
        if after is None:  # no fine-tuning job's id: nothing comes after it
            return [], False, None
        page = page.model_copy(update={"after": after})
    rows, has_more, nxt = paginate(session, stmt, Job.id, page)
    return rows, has_more, to_openai("job", nxt) if nxt else None
