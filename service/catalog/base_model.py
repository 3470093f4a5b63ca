"""A job's `base_model`, resolved at submission: a catalog name, one of the tenant's own
checkpoint ids, or the tinker:// path of one of its Tinker runs' sampler weights (an adapter on
the run's catalog base, `service.catalog.lineage`). Nothing else is accepted (no file paths, no
URLs, no unregistered Hub ids), and the refusal reads the same whatever the string names on any
machine."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from service.catalog.lineage import TINKER_PREFIX, find_sampler_weights
from service.catalog.service import find_model, find_tenant_checkpoint, model_names
from service.core.problems import FieldError
from service.core.suggest import did_you_mean
from service.models import CatalogModel, Checkpoint

CHECKPOINT_PREFIX = "ckpt_"
MAX_LINEAGE = 32  # adapters on adapters: each is merged in turn when the job loads


@dataclass
class ResolvedBase:
    model: CatalogModel  # the catalog model under the weights
    parent: Checkpoint | None = None  # the checkpoint this job starts from, if any
    # The checkpoints the starting weights are built from, nearest first: the parent, then
    # (while the parent is an adapter) the bases of its own job. None of them may be deleted
    # while this job is live.
    lineage: list[str] = field(default_factory=list)


def _refusal(value: str, hint: str = "") -> FieldError:
    shown = value if len(value) <= 80 else value[:77] + "..."
    return FieldError(
        path="$.base_model",
        message=f"{shown!r} is neither a catalog model nor a checkpoint of yours "
        f"(`grpo models` or GET /v1/models lists both){hint}",
    )


def resolve_base(
    session: Session, tenant_id: str, value: str
) -> tuple[ResolvedBase | None, FieldError | None]:
    if value.startswith(CHECKPOINT_PREFIX):
        return _from_checkpoint(session, tenant_id, value)
    if value.startswith(TINKER_PREFIX):
        return _from_sampler_weights(session, tenant_id, value)
    model = find_model(session, value)
    if model is None:  # the catalog is every tenant's: its names may be offered to any
        return None, _refusal(value, did_you_mean(value, model_names(session)))
    return ResolvedBase(model), None


def _from_checkpoint(
    session: Session, tenant_id: str, checkpoint_id: str
) -> tuple[ResolvedBase | None, FieldError | None]:
    found = find_tenant_checkpoint(session, tenant_id, checkpoint_id)
    if found is None:  # another tenant's checkpoint reads exactly like a missing one
        return None, _refusal(checkpoint_id)
    checkpoint, job = found
    root = job.base_model or job.spec.get("base_model", "")
    model, error = _trained_from(session, checkpoint_id, root)
    if model is None:
        return None, error
    lineage = [checkpoint.id]
    if checkpoint.format != "full":  # an adapter needs its own job's starting weights too
        lineage += list(job.spec.get("lineage", []))
    if len(lineage) > MAX_LINEAGE:
        return None, FieldError(
            path="$.base_model",
            message=f"{checkpoint_id} sits on {len(lineage) - 1} adapters; at most "
            f"{MAX_LINEAGE - 1} (start from a checkpoint with merged or full weights)",
        )
    return ResolvedBase(model, checkpoint, lineage), None


def _from_sampler_weights(
    session: Session, tenant_id: str, path: str
) -> tuple[ResolvedBase | None, FieldError | None]:
    found = find_sampler_weights(session, tenant_id, path)
    # Another tenant's path reads exactly like a missing one.
    model, error = _trained_from(session, path, found[1].base_model) if found else (None, None)
    if found is None or model is None:
        return None, error or _refusal(path)
    # The lineage pins the checkpoint's id: the path may be overwritten with other weights.
    return ResolvedBase(model, None, [found[0].id]), None


def _trained_from(
    session: Session, what: str, root: str
) -> tuple[CatalogModel | None, FieldError | None]:
    model = find_model(session, root)
    if model is None:
        message = f"{what} was trained from {root!r}, which the catalog no longer has"
        return None, FieldError(path="$.base_model", message=message)
    return model, None
