"""Evaluations (docs/evaluations.md): POST /v1/evaluations."""

from __future__ import annotations

from pydantic import BaseModel, Field


class EvaluationSettings(BaseModel):
    """How large an evaluation may be."""

    eval_max_records: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Records an evaluation may sample (a larger dataset, or max_records, is a "
        "422 naming the field).",
    )
    eval_max_open_per_tenant: int = Field(
        8,
        ge=1,
        description="Evaluations a tenant may have queued, running or cancelling at once "
        "(429 with Retry-After beyond it).",
    )
    eval_open_retry_after_s: int = Field(
        30, ge=1, description="Retry-After sent with the 429 for too many open evaluations."
    )
