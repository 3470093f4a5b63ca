"""Datasets: validated records stored as canonical JSONL in object storage."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.core.problems import FieldError, conflict, invalid, not_found
from service.core.quotas import check_dataset_quota
from service.core.suggest import MAX_NAMES, did_you_mean
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
    """A dataset named by id, or by name: the newest live dataset of the tenant with that name
    (a name's uploads are its versions; an older one is named by its id); otherwise None and
    why, with the closest of the tenant's own names."""
    if reference.startswith("ds_"):
        row = find_dataset(session, tenant_id, reference)
        return row, None if row else f"no dataset '{reference}'"
    mine = (Dataset.tenant_id == tenant_id, Dataset.deleted_at.is_(None))
    row = session.scalar(
        select(Dataset)
        .where(*mine, Dataset.name == reference)
        .order_by(Dataset.created_at.desc(), Dataset.id.desc())
        .limit(1)
    )
    if row is not None:
        return row, None
    names = session.scalars(select(Dataset.name).where(*mine).distinct().limit(MAX_NAMES))
    return None, f"no dataset '{reference}'{did_you_mean(reference, names)}"


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
    with _lines(storage, row, start, stop) as lines:
        chosen = [json.loads(line) for line in lines]
    return list(enumerate(chosen, start)), stop < row.num_records


FIELD_SAMPLE = 200  # records whose field names a submission checks its verifiers against


def record_fields(storage: ObjectStorage, row: Dataset, limit: int = FIELD_SAMPLE) -> set[str]:
    """The field names of the dataset's first `limit` records (any of them has the field),
    read one record at a time."""
    fields: set[str] = set()
    with _lines(storage, row, 0, min(limit, row.num_records)) as lines:
        for line in lines:
            record = json.loads(line)
            if isinstance(record, dict):  # stored records are objects; stay total anyway
                fields.update(record)
    return fields


@contextmanager
def _lines(
    storage: ObjectStorage, row: Dataset, start: int, stop: int
) -> Iterator[Iterator[bytes]]:
    """The stored lines `start` to `stop` (0-based, `stop` excluded), read from the nearest
    indexed line before them (`line_index`); the file or S3 body is closed on leaving."""
    if start >= stop:
        yield iter(())
        return
    first, last = start // line_index.EVERY, -(-stop // line_index.EVERY)
    begin, end = line_index.span(storage, row.object_key, first, last)
    if end is None:
        end = row.size_bytes or storage.size(row.object_key)
    chunks = storage.open_range(row.object_key, begin, end - 1, line_index.CHUNK)
    lines = line_index.iter_lines(chunks)
    try:
        skip = first * line_index.EVERY
        yield itertools.islice(lines, start - skip, stop - skip)
    finally:
        lines.close()  # and the file or S3 body under it
