"""Typed responses: models generated from the API's OpenAPI document (models_generated.py,
by service/client/generate_models.py), plus the list envelope."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from pydantic import BaseModel, PrivateAttr

from grpo_client.models_generated import (
    CheckpointOut,
    DatasetOut,
    DatasetRecordOut,
    EventOut,
    JobCreate,
    JobOut,
    JobStatus,
    VerifierOut,
    VerifierTestResult,
)

T = TypeVar("T")

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
# Where a job stays until someone acts: final, or paused (until resumed).
SETTLED_STATUSES = FINAL_STATUSES | {"paused"}


class Page(BaseModel, Generic[T]):
    """One page of a list: `{data, has_more, next}`, newest first. Iterating it yields the
    items of this page and of every later one, fetched as the loop reaches them."""

    data: list[T]
    has_more: bool
    next: str | None
    _fetch_after: Callable[[str], Page[T]] | None = PrivateAttr(default=None)

    def with_fetcher(self, fetch_after: Callable[[str], Page[T]]) -> Page[T]:
        self._fetch_after = fetch_after
        return self

    def __iter__(self) -> Iterator[T]:  # type: ignore[override]  # items, not fields
        page: Page[T] = self
        while True:
            yield from page.data
            if not (page.has_more and page.next and self._fetch_after):
                return
            page = self._fetch_after(page.next)


__all__ = [
    "FINAL_STATUSES",
    "SETTLED_STATUSES",
    "CheckpointOut",
    "DatasetOut",
    "DatasetRecordOut",
    "EventOut",
    "JobCreate",
    "JobOut",
    "JobStatus",
    "Page",
    "VerifierOut",
    "VerifierTestResult",
]
