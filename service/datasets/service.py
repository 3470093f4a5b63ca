"""Datasets: validated records stored as canonical JSONL in object storage."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.core.problems import FieldError, conflict, invalid, not_found
from service.core.quotas import check_dataset_quota
from service.datasets import line_index
from service.datasets.builder import BuiltDataset
from service.models import UNFINISHED_STATUSES, Dataset, Job
from service.models.base import utcnow
from service.settings import Settings
from service.storage import ObjectStorage


def create_dataset(
    session: Session,
    storage: ObjectStorage,
    settings: Settings,
    tenant_id: str,
    name: str,
    built: BuiltDataset,
) -> Dataset:
    check_dataset_quota(session, settings, tenant_id, len(built.data))
    data = bytes(built.data)
    dataset_id = new_id("ds")
    key = f"tenants/{tenant_id}/datasets/{dataset_id}.jsonl"
    # The objects are in place before the row that points at them is committed.
    storage.put_bytes(line_index.key_for(key), line_index.encode(built.line_starts))
    storage.put_bytes(key, data)
    row = Dataset(
        id=dataset_id,
        tenant_id=tenant_id,
        name=name,
        num_records=built.num_records,
        sha256=hashlib.sha256(data).hexdigest(),
        object_key=key,
        size_bytes=len(data),
        prompt_stats={"chat": built.chat},
    )
    session.add(row)
    session.flush()
    return row


# A dataset a tenant can use: its own, not deleted. Built once with bound parameters.
_LIVE = (
    Dataset.id == bindparam("id"),
    Dataset.tenant_id == bindparam("tenant"),
    Dataset.deleted_at.is_(None),
)
_FIND = select(Dataset).where(*_LIVE)


def find_dataset(session: Session, tenant_id: str, dataset_id: str) -> Dataset | None:
    return session.scalar(_FIND, {"id": dataset_id, "tenant": tenant_id})


def find_dataset_by_reference(
    session: Session, tenant_id: str, reference: str
) -> tuple[Dataset | None, str | None]:
    """A dataset named by id, or by name when exactly one live dataset of the tenant has it;
    otherwise None and why."""
    if reference.startswith("ds_"):
        row = find_dataset(session, tenant_id, reference)
        return row, None if row else f"no dataset '{reference}'"
    rows = list(
        session.scalars(
            select(Dataset)
            .where(
                Dataset.tenant_id == tenant_id,
                Dataset.name == reference,
                Dataset.deleted_at.is_(None),
            )
            .order_by(Dataset.id)
            .limit(6)
        )
    )
    if len(rows) == 1:
        return rows[0], None
    if not rows:
        return None, f"no dataset '{reference}'"
    ids = ", ".join(r.id for r in rows[:5])
    return (
        None,
        f"{len(rows) if len(rows) < 6 else 'more than 5'} datasets are named "
        f"'{reference}' ({ids}): use an id",
    )


def get_dataset(session: Session, tenant_id: str, dataset_id: str) -> Dataset:
    row = find_dataset(session, tenant_id, dataset_id)
    if row is None:
        raise not_found("dataset", dataset_id)
    return row


def delete_dataset(session: Session, tenant_id: str, dataset_id: str) -> None:
    row = get_dataset(session, tenant_id, dataset_id)
    live = session.scalar(
        select(Job.id)
        .where(
            (Job.dataset_id == dataset_id) | (Job.eval_dataset_id == dataset_id),
            Job.status.in_(UNFINISHED_STATUSES),  # a paused job trains again
        )
        .limit(1)
    )
    if live:
        raise conflict(f"dataset '{dataset_id}' is used by live job '{live}'")
    # Soft delete: finished jobs keep pointing at the row; the records stay for their audit.
    row.deleted_at = utcnow()
    session.flush()


def page_records(
    storage: ObjectStorage, row: Dataset, limit: int, after: str | None
) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
    """Records after position `after` (None: from the first), in file order: (index, record)
    pairs and whether more follow. Positions are 0-based; the stored file is canonical JSONL,
    one record a line. Only the page's lines are read, from the nearest indexed line before
    it (`line_index`): memory holds the page, never the dataset."""
    start = 0
    if after is not None:
        if not after.isdigit() or len(after) > 10:
            message = "must be a record id: its 0-based position, e.g. 19"
            raise invalid([FieldError(path="query.after", message=message)])
        start = int(after) + 1
    stop = min(start + limit, row.num_records)
    if start >= stop:
        return [], False
    first, last = start // line_index.EVERY, -(-stop // line_index.EVERY)
    begin, end = line_index.span(storage, row.object_key, first, last)
    if end is None:
        end = row.size_bytes or storage.size(row.object_key)
    chunks = storage.open_range(row.object_key, begin, end - 1, line_index.CHUNK)
    lines = line_index.iter_lines(chunks)
    try:
        skip = first * line_index.EVERY
        chosen = list(itertools.islice(lines, start - skip, stop - skip))
    finally:
        lines.close()  # and the file or S3 body under it
    return [(start + i, json.loads(line)) for i, line in enumerate(chosen)], stop < row.num_records
