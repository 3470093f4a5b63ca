"""OpenAI files over our datasets: a file IS a dataset uploaded in OpenAI's line format, with
`purpose` set; one source of truth (the records in object storage, the row in `datasets`)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.openai_ids import to_openai, to_ours
from service.core.pagination import PageParams, paginate
from service.core.problems import not_found
from service.datasets import service as datasets
from service.datasets.builder import BuiltDataset
from service.files import lines
from service.models import Dataset
from service.settings import Settings
from service.storage import ObjectStorage


def create_file(
    session: Session,
    storage: ObjectStorage,
    settings: Settings,
    tenant_id: str,
    filename: str,
    purpose: str,
    built: BuiltDataset,
) -> Dataset:
    row = datasets.create_dataset(session, storage, settings, tenant_id, filename, built)
    row.purpose = purpose
    session.flush()
    return row


def find_file(session: Session, tenant_id: str, file_id: str) -> Dataset | None:
    """The tenant's live dataset behind `file-…`, if it was uploaded as a file."""
    dataset_id = to_ours("file", file_id)
    row = datasets.find_dataset(session, tenant_id, dataset_id) if dataset_id else None
    return row if row is not None and row.purpose is not None else None


def get_file(session: Session, tenant_id: str, file_id: str) -> Dataset:
    row = find_file(session, tenant_id, file_id)
    if row is None:
        raise not_found("file", file_id)
    return row


def list_files(
    session: Session, tenant_id: str, page: PageParams, purpose: str | None
) -> tuple[list[Dataset], bool, str | None]:
    stmt = select(Dataset).where(
        Dataset.tenant_id == tenant_id, Dataset.deleted_at.is_(None), Dataset.purpose.is_not(None)
    )
    if purpose is not None:
        stmt = stmt.where(Dataset.purpose == purpose)
    if page.after is not None:
        after = to_ours("file", page.after)
        if after is None:  # no file's id: nothing comes after it
            return [], False, None
        page = page.model_copy(update={"after": after})
    rows, has_more, nxt = paginate(session, stmt, Dataset.id, page)
    return rows, has_more, to_openai("file", nxt) if nxt else None


def delete_file(session: Session, tenant_id: str, file_id: str) -> str:
    """As DELETE /v1/datasets/{id}: 409 while a live job trains on it."""
    row = get_file(session, tenant_id, file_id)
    datasets.delete_dataset(session, tenant_id, row.id)
    return file_id


def file_content(storage: ObjectStorage, row: Dataset) -> bytes:
    return lines.content(storage.get_bytes(row.object_key))
