"""OpenAI's file objects (`openai.types.FileObject`), field for field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.core.openai_ids import to_openai
from service.files.lines import EXTRA_BYTES_PER_LINE
from service.models import Dataset

PURPOSE: Literal["fine-tune"] = "fine-tune"


def unix(value: datetime) -> int:
    """OpenAI's times: Unix seconds (our own routes answer RFC 3339)."""
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())


class FileOut(BaseModel):
    id: str = Field(description="`file-…`: dataset `ds_…` under OpenAI's prefix.")
    object: Literal["file"] = "file"
    bytes: int = Field(description="Of the content GET /v1/files/{id}/content answers.")
    created_at: int = Field(description="Unix time.")
    filename: str
    purpose: Literal["fine-tune"] = PURPOSE
    status: Literal["processed"] = Field(
        "processed", description="Always processed: every line is validated at upload."
    )
    status_details: str | None = None
    expires_at: int | None = None
    dataset: str = Field(description="The same records as our dataset (GET /v1/datasets/{id}).")

    @classmethod
    def of(cls, row: Dataset) -> FileOut:
        return cls(
            id=to_openai("file", row.id),
            bytes=(row.size_bytes or 0) + EXTRA_BYTES_PER_LINE * row.num_records,
            created_at=unix(row.created_at),
            filename=row.name,
            dataset=row.id,
        )


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileOut]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
    next: str | None = Field(None, description="`after` for the next page, when has_more.")


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
