"""The Tinker-compatible API (docs/tinker.md): its long-poll and its worker."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TinkerSettings(BaseModel):
    tinker_max_open_sessions: int = Field(
        16,
        ge=1,
        description="Tinker sessions a tenant may hold open at once: created, not finished, "
        "and heartbeating within GRPO_TINKER_SESSION_IDLE_S (429 with Retry-After beyond it).",
    )
    tinker_session_idle_s: float = Field(
        300.0,
        gt=0,
        description="A Tinker session with no heartbeat for this long no longer counts as open "
        "(the SDK heartbeats every few seconds while a client lives).",
    )
    tinker_sessions_retry_after_s: int = Field(
        30, ge=1, description="Retry-After sent with the 429 for too many open Tinker sessions."
    )
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
    tinker_ephemeral_ttl_s: int = Field(
        3600,
        ge=1,
        le=10 * 365 * 86400,
        description="How long the sampler weights of save_weights_and_get_sampling_client (no "
        "name: the SDK calls them ephemeral) are kept before they expire and are deleted.",
    )
