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
    # What one request may ask of the worker (docs/tinker.md, "Limits and turns"): checked at
    # submission (413), and advertised to the SDK, which splits a bigger forward_backward into
    # requests within them. A tenant's small request waits behind at most one such request of
    # another tenant's, so these bound that wait.
    tinker_max_data_per_request: int = Field(
        1024, ge=1, description="Data in one forward or forward_backward request."
    )
    tinker_max_tokens_per_datum: int = Field(
        32768,
        ge=1,
        description="Tokens of one datum (and of one sample's prompt plus max_tokens); the "
        "model's context bounds it too.",
    )
    tinker_max_tokens_per_request: int = Field(
        32768,
        ge=1,
        description="Tokens of one request: its data's together, or a sample's num_samples x "
        "(prompt + max_tokens).",
    )
    tinker_request_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Engine time of one forward, forward_backward or sample: past it the request "
        "is stopped at its next micro-batch or decoding step and fails, the run as before it.",
    )
    tinker_fair_window_s: float = Field(
        600.0,
        gt=0,
        description="The recent past whose device-seconds order the tenants' turns: the tenant "
        "that has used the least in it goes first.",
    )
