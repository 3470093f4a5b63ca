"""The stored weights a model is built from: a job's `lineage` holds checkpoint ids, nearest
first, each a job's checkpoint (`ckpt_…`) or a Tinker run's sampler weights (`tkc_…`, a peft
adapter on its run's catalog base; docs/tinker.md). A `tinker://<run>/sampler_weights/<name>`
path names the latter wherever a model is named (a job's `base_model`, an evaluation's)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.text import text_problem
from service.models import Checkpoint, TinkerCheckpoint, TinkerRun

TINKER_PREFIX = "tinker://"
TINKER_ID_PREFIX = "tkc_"
SAMPLER_SEGMENT = "/sampler_weights/"

LineageRow = Checkpoint | TinkerCheckpoint


def find_sampler_weights(
    session: Session, tenant_id: str, path: str
) -> tuple[TinkerCheckpoint, TinkerRun] | None:
    """The tenant's sampler checkpoint at a tinker:// path, with its run; None exactly as for
    a missing one for anything else (another tenant's, an expired one, a training-state path, a
    bad path)."""
    run_id, segment, name = path.removeprefix(TINKER_PREFIX).partition(SAMPLER_SEGMENT)
    if not (path.startswith(TINKER_PREFIX) and segment and run_id and name) or text_problem(path):
        return None
    row = session.execute(
        select(TinkerCheckpoint, TinkerRun)
        .join(TinkerRun, TinkerRun.id == TinkerCheckpoint.run_id)
        .where(
            TinkerCheckpoint.run_id == run_id,
            TinkerCheckpoint.kind == "sampler",
            TinkerCheckpoint.name == name,
            TinkerRun.tenant_id == tenant_id,
            TinkerCheckpoint.unexpired(),
        )
    ).first()
    return None if row is None else (row[0], row[1])


def lineage_rows(session: Session, ids: Iterable[str]) -> list[LineageRow | None]:
    """The rows of a lineage, in its order; None for a deleted one."""
    return [
        session.get(TinkerCheckpoint, i)
        if i.startswith(TINKER_ID_PREFIX)
        else session.get(Checkpoint, i)
        for i in ids
    ]


def is_full(row: LineageRow | None) -> bool:
    """Whether the row holds whole weights (the chain below it ends there): Tinker sampler
    weights are always an adapter."""
    return isinstance(row, Checkpoint) and row.format == "full"
