"""Datasets: validated records stored as canonical JSONL in object storage."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from service.datasets.records import to_jsonl
from service.ids import new_id
from service.models import LIVE_STATUSES, Dataset, Job
from service.models.base import utcnow
from service.problems import FieldError, conflict, invalid, not_found
from service.storage import ObjectStorage


def create_dataset(
    session: Session,
    storage: ObjectStorage,
    tenant_id: str,
    name: str,
    records: list[dict[str, Any]],
    max_records: int,
) -> Dataset:
    if len(records) > max_records:
        raise invalid([FieldError(path="$.records", message=f"more than {max_records} records")])
    data = to_jsonl(records)
    dataset_id = new_id("ds")
    key = f"tenants/{tenant_id}/datasets/{dataset_id}.jsonl"
    # The object is in place before the row that points at it is committed.
    storage.put_bytes(key, data)
    row = Dataset(
        id=dataset_id,
        tenant_id=tenant_id,
        name=name,
        num_records=len(records),
        sha256=hashlib.sha256(data).hexdigest(),
        object_key=key,
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
_EXISTS = select(Dataset.id).where(*_LIVE)


def find_dataset(session: Session, tenant_id: str, dataset_id: str) -> Dataset | None:
    return session.scalar(_FIND, {"id": dataset_id, "tenant": tenant_id})


def dataset_exists(session: Session, tenant_id: str, dataset_id: str) -> bool:
    """As `find_dataset(...) is not None`, reading just the id (job submission's hot path)."""
    return session.execute(_EXISTS, {"id": dataset_id, "tenant": tenant_id}).first() is not None


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
            Job.status.in_(LIVE_STATUSES),
        )
        .limit(1)
    )
    if live:
        raise conflict(f"dataset '{dataset_id}' is used by live job '{live}'")
    # Soft delete: finished jobs keep pointing at the row; the records stay for their audit.
    row.deleted_at = utcnow()
    session.flush()
