"""Forks: a new job that continues another job's training from one of its checkpoints, with some
knobs changed. The parent's stored spec, turned back into a request and deep-merged with the
overrides, goes through `service.create_job` exactly as a POST /v1/jobs body does; the new job
then resumes from the fork point's trainer state (`resume.start_checkpoint`)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from service.core.problems import FieldError, ProblemError, invalid, json_path
from service.core.pydantic_errors import field_message
from service.jobs import lifecycle, service
from service.jobs.schemas import ForkCreate, ForkedFrom, JobCreate
from service.models import Checkpoint, Job
from service.settings import Settings
from service.storage import ObjectStorage

# What a fork may change: knobs of the optimisation and of sampling that the restored trainer
# state does not fix. The data (dataset, batch shape, seed: the stream's position and the RNG
# are restored), the model and the adapter's shape stay the parent's.
FORKABLE = frozenset(
    {
        "name", "verifiers", "eval_verifiers", "checkpoint_every", "eval_every",
        "keep_checkpoints", "rollouts", "queue", "resources.devices", "resources.rollout_devices",
        "grpo.steps", "grpo.learning_rate", "grpo.beta", "grpo.weight_decay",
        "grpo.clip_epsilon", "grpo.clip_epsilon_high", "grpo.max_grad_norm",
        "grpo.num_iterations", "grpo.loss_aggregation", "grpo.std", "grpo.micro_batch_size",
        "grpo.micro_batch_tokens",
        "grpo.mask_truncated_completions", "grpo.skip_zero_std_groups",
        "grpo.max_resample_rounds",
        "generation.max_new_tokens", "generation.temperature", "generation.top_p",
        "generation.top_k", "generation.stop",
    }
)  # fmt: skip
_GROUPS = frozenset(path.split(".")[0] for path in FORKABLE if "." in path)


def fork_job(
    session: Session,
    storage: ObjectStorage,
    settings: Settings,
    tenant_id: str,
    parent: Job,
    body: ForkCreate,
) -> Job:
    """The new job, queued, starting from `parent`'s checkpoint at `body.step`: 404 when that
    step has no checkpoint, 422 naming the field for an override a fork cannot make or a merged
    spec POST /v1/jobs would refuse."""
    point = service.get_checkpoint(session, parent, str(body.step))
    errors = _check_overrides(body.overrides)
    if point.step >= parent.total_steps:
        errors.append(FieldError(path="$.step", message=(
            f"step {point.step} is {parent.id}'s final checkpoint, which holds the model alone "
            "(no optimizer state to continue from): fork from an earlier checkpoint, or submit "
            f"a new job with base_model {point.id}"
        )))  # fmt: skip
    if errors:
        raise invalid(errors)
    merged = _deep_merge(_request_of(parent.spec), body.overrides)
    steps = (merged.get("grpo") or {}).get("steps")
    if isinstance(steps, int) and steps <= point.step:
        where = "$.overrides.grpo.steps" if "steps" in body.overrides.get("grpo", {}) else "$.step"
        message = f"the fork starts after step {point.step}: grpo.steps must be more ({steps})"
        raise invalid([FieldError(path=where, message=message)])
    try:
        request = JobCreate.model_validate(merged)
        job = service.create_job(session, storage, settings, tenant_id, request)
    except ValidationError as exc:
        raise invalid([
            FieldError(path=_blame(json_path(e["loc"]), body.overrides),
                       message=field_message(e, JobCreate))
            for e in exc.errors()
        ]) from None  # fmt: skip
    except ProblemError as exc:
        if exc.problem.status == 422 and exc.problem.errors:
            errors = [
                FieldError(path=_blame(e.path, body.overrides), message=e.message)
                for e in exc.problem.errors
            ]
            raise invalid(errors) from None
        raise
    _link(session, parent, job, point)
    return job


def _link(session: Session, parent: Job, job: Job, point: Checkpoint) -> None:
    """Lineage on both sides; the fork's progress starts at the fork point's step."""
    fork = ForkedFrom(job_id=parent.id, step=point.step, checkpoint_id=point.id)
    job.forked_from, job.step = fork.model_dump(), point.step
    data = {**fork.model_dump(), "fork": job.id}
    lifecycle.add_event(session, job.id, "forked",
                        f"forked from job {parent.id} at step {point.step}", data)  # fmt: skip
    lifecycle.add_event(session, parent.id, "fork",
                        f"job {job.id} forked from step {point.step}", data)  # fmt: skip
    session.flush()


def _request_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The stored spec as a POST /v1/jobs body again: the fields a request has (none of what
    the service resolved), the verifiers pinned to the versions the parent used. The
    environment keeps its pinned version (`environment.version`), so the fork's submission pins
    the same one, and stores the same `environment_sha256`. An environment job without
    verifiers stored `eval_verifiers: []` (the copy of its verifiers): a request says that by
    leaving it out."""
    body = {k: v for k, v in spec.items() if k in JobCreate.model_fields}
    if body.get("eval_verifiers") == []:
        del body["eval_verifiers"]
    for field in ("verifiers", "eval_verifiers"):
        if body.get(field) is not None:
            body[field] = [
                {"name": v["name"], "version": v["version"], "weight": v["weight"]}
                for v in body[field]
            ]
    return body


def _deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _check_overrides(overrides: dict[str, Any], prefix: str = "") -> list[FieldError]:
    errors = []
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if path in FORKABLE:
            continue
        if not prefix and key in _GROUPS:
            if isinstance(value, dict):
                errors += _check_overrides(value, f"{path}.")
            else:
                errors.append(FieldError(path=f"$.overrides.{path}",
                                         message="an object of the fields to change"))  # fmt: skip
            continue
        allowed = ", ".join(sorted(FORKABLE))
        errors.append(FieldError(
            path=f"$.overrides.{path}",
            message=f"a fork cannot change {path}; it can change {allowed}",
        ))  # fmt: skip
    return errors


def _blame(path: str, overrides: dict[str, Any]) -> str:
    """`$.grpo.steps` of the merged spec -> `$.overrides.grpo.steps` when the override set it
    (the parent's own fields were valid when it was submitted)."""
    node: Any = overrides
    for name in re.findall(r"\.([^.\[]+)", path):
        if not isinstance(node, dict):
            break  # inside a value the override replaced whole (a list of verifiers)
        if name not in node:
            return path
        node = node[name]
    return "$.overrides" + path.removeprefix("$")
