"""The Tinker-compatible API (docs/tinker.md): its long-poll and its worker."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TinkerSettings(BaseModel):
    tinker_long_poll_s: float = Field(
        10.0,
        gt=0,
        le=40,
        description="How long retrieve_future holds a pending request before it answers "
        "try_again (the SDK waits 45 s for an answer, then asks again).",
    )
    tinker_worker_poll_s: float = Field(
        0.5,
        gt=0,
        description="Longest pause of an idle tinker worker between two looks for queued "
        "requests (it looks again at once after a request, then backs off to this).",
    )
    tinker_max_resident_runs: int = Field(
        16,
        ge=1,
        description="Runs whose adapter and optimiser state a tinker worker keeps in memory "
        "per base model; the least recently used beyond that are evicted to its disk.",
    )
