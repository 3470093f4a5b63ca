"""Per-tenant quotas: datasets, rollouts, Tinker checkpoints, registered versions, open jobs,
concurrent tests."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QuotaSettings(BaseModel):
    """How much one tenant may hold or run at once (429 or 413 beyond)."""

    max_dataset_records: int = Field(1_000_000, ge=1, description="Most records in one dataset.")
    max_dataset_line_bytes: int = Field(
        1 << 20, ge=1, description="Longest JSONL line (one record, UTF-8 bytes) in a dataset."
    )
    max_datasets_per_tenant: int = Field(
        1000, ge=1, description="Datasets a tenant may keep (429 beyond: delete some)."
    )
    max_dataset_bytes_per_tenant: int = Field(
        10 << 30, ge=1, description="Bytes of canonical JSONL a tenant's datasets may hold (413)."
    )
    max_rollout_bytes_per_tenant: int = Field(
        0,
        ge=0,
        description="Bytes of stored rollouts (Parquet) a tenant's jobs may hold; past "
        "it a job stores no more (a warning event); 0 = unlimited.",
    )
    max_tinker_bytes_per_tenant: int = Field(
        100 << 30,
        ge=0,
        description="Bytes of Tinker checkpoints (save_state, save_weights_for_sampler) a tenant "
        "may keep; a save that would pass it is refused (413); 0 = unlimited.",
    )
    max_verifier_versions_per_tenant: int = Field(
        10_000, ge=1, description="Verifier versions a tenant may register, all names (429)."
    )
    max_environment_versions_per_tenant: int = Field(
        10_000, ge=1, description="Environment versions a tenant may register, all names (429)."
    )
    max_open_jobs_per_tenant: int = Field(
        100, ge=1, description="Queued, running or cancelling jobs a tenant may have at once."
    )
    open_jobs_retry_after_s: int = Field(
        30, ge=1, description="Retry-After sent with the 429 for too many open jobs."
    )
    max_concurrent_tests_per_tenant: int = Field(
        4,
        ge=1,
        description="`/v1/verifiers/{name}/test`, grader runs and `/v1/environments/{name}/test` "
        "calls a tenant may run at once per API process, all together (429 beyond).",
    )
