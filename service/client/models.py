"""Typed responses: the API's own pydantic schemas (no FastAPI, SQLAlchemy or torch behind
them), plus the list envelope."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel

from service.datasets.schemas import DatasetOut
from service.jobs.schemas import (
    CheckpointOut,
    EventOut,
    JobCreate,
    JobOut,
    JobStatus,
)
from service.verifiers.schemas import VerifierOut, VerifierTestResult

T = TypeVar("T")

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class Page(BaseModel, Generic[T]):
    """One page of a list: `{data, has_more, next}`, newest first."""

    data: list[T]
    has_more: bool
    next: str | None


__all__ = [
    "FINAL_STATUSES",
    "CheckpointOut",
    "DatasetOut",
    "EventOut",
    "JobCreate",
    "JobOut",
    "JobStatus",
    "Page",
    "VerifierOut",
    "VerifierTestResult",
]
