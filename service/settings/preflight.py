"""Pre-flight (docs/preflight.md): POST /v1/jobs/preflight and a job's `preflight: require`."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PreflightSettings(BaseModel):
    """How big a pre-flight is, how long the API and the worker give it, how many at once."""

    preflight_prompts: int = Field(
        4, ge=1, le=64, description="Prompts a pre-flight samples, group_size completions each."
    )
    preflight_wait_s: float = Field(
        30.0,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description="How long POST /v1/jobs/preflight waits for the result; then 202 with a "
        "Location to poll.",
    )
    preflight_timeout_s: float = Field(
        900.0,
        gt=0,
        allow_inf_nan=False,
        description="A pre-flight still queued after this (no worker took it), or running after "
        "this (its worker killed it, or died), has failed.",
    )
    preflight_max_open: int = Field(
        2, ge=1, description="Pre-flights a tenant may have queued or running at once (429)."
    )
