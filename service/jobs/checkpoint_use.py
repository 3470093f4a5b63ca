"""Whether a checkpoint is what an unfinished job starts from: the rule that keeps a job's base,
lineage or fork point from being deleted or pruned under it. A module of its own, with nothing
of the API's job service: the training process (pruning) and the Tinker routes ask it too."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import UNFINISHED_STATUSES, Checkpoint, Job


def checkpoint_in_use(session: Session, checkpoint_id: str) -> bool:
    """Whether an unfinished job of the checkpoint's tenant starts from it: its `base_model`,
    in the `lineage` of adapters its starting weights are merged from, or its fork point. The
    jobs' specs are compared in Python: a JSON path query is not portable between SQLite and
    PostgreSQL, and a tenant has few unfinished jobs (the open-jobs limit, plus paused ones)."""
    tenant_id = session.scalar(
        select(Job.tenant_id)
        .join(Checkpoint, Checkpoint.job_id == Job.id)
        .where(Checkpoint.id == checkpoint_id)
    )
    return tenant_id is not None and lineage_in_use(session, tenant_id, checkpoint_id)


def lineage_in_use(session: Session, tenant_id: str, checkpoint_id: str) -> bool:
    """Whether an unfinished job of the tenant starts from the checkpoint (a job's, or a Tinker
    run's sampler weights: `service.catalog.lineage`)."""
    rows = session.execute(
        select(Job.spec, Job.forked_from).where(
            Job.tenant_id == tenant_id, Job.status.in_(UNFINISHED_STATUSES)
        )
    )
    return any(_starts_from(spec, fork, checkpoint_id) for spec, fork in rows)


def _starts_from(spec: Any, fork: Any, checkpoint_id: str) -> bool:
    if isinstance(fork, dict) and fork.get("checkpoint_id") == checkpoint_id:
        return True
    return isinstance(spec, dict) and (
        spec.get("base_model") == checkpoint_id or checkpoint_id in spec.get("lineage", [])
    )
