"""Process settings (pydantic-settings). Unset means the embedded default: SQLite, a local object
folder and a Celery broker that needs no server, all under `GRPO_DATA_DIR`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GRPO_", extra="ignore")

    data_dir: Path = Field(Path(".grpo"), description="Root of every embedded-mode file.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; unset = SQLite.")
    broker_url: str | None = Field(None, description="Celery broker URL; unset = filesystem.")
    storage_url: str | None = Field(None, description="file://PATH or s3://bucket[/prefix].")
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto).")
    s3_region: str | None = Field(None, description="S3 region.")
    s3_access_key_id: str | None = Field(None, description="S3 access key id.")
    s3_secret_access_key: str | None = Field(None, description="S3 secret access key.")
    s3_create_bucket: bool = Field(False, description="Create the bucket at start-up if missing.")

    lease_seconds: float = Field(
        60.0, gt=0, description="A worker's claim on a job lasts this long."
    )
    heartbeat_seconds: float = Field(10.0, gt=0, description="How often a worker renews its lease.")
    reconcile_seconds: float = Field(15.0, gt=0, description="How often the reconciler runs.")
    requeue_after_seconds: float = Field(
        60.0, gt=0, description="Re-enqueue a queued job whose message seems lost after this long."
    )
    max_attempts: int = Field(3, ge=1, description="Claims a job gets before it fails for good.")
    max_request_bytes: int = Field(
        64 << 20, ge=1, description="Largest accepted request body (counted as it streams in)."
    )
    max_dataset_records: int = Field(1_000_000, ge=1, description="Most records in one dataset.")
    max_dataset_line_bytes: int = Field(
        1 << 20, ge=1, description="Longest JSONL line (one record, UTF-8 bytes) in a dataset."
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
        description="`/v1/verifiers/{name}/test` calls a tenant may run at once per API "
        "process (429 beyond).",
    )
    idempotency_ttl_s: int = Field(
        24 * 3600, ge=1, description="How long an Idempotency-Key and its response are kept."
    )
    idempotency_wait_s: float = Field(
        10.0, ge=0, description="How long a duplicate waits for the first request to finish."
    )
    idempotency_lock_s: float = Field(
        120.0, gt=0, description="An unfinished key older than this is taken over (crashed API)."
    )
    auth_cache_s: float = Field(
        2.0, ge=0, description="Seconds an API key lookup is cached in-process (0 = off)."
    )
    sse_keepalive_s: float = Field(
        15.0, gt=0, description="An idle event stream sends a keep-alive comment this often."
    )
    download_redirect: bool = Field(
        False, description="Answer checkpoint downloads with a 307 to a presigned URL (S3)."
    )
    download_url_expires_s: int = Field(300, ge=1, description="Presigned download URL lifetime.")
    allow_unsafe_verifiers: bool = Field(
        False, description="Run python verifiers without the bubblewrap sandbox (never in prod)."
    )

    @property
    def data_path(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_path / 'grpo.db'}"

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def broker_folder(self) -> Path:
        return self.data_path / "broker"

    @property
    def effective_storage_url(self) -> str:
        return self.storage_url or f"file://{self.data_path / 'objects'}"

    @property
    def embedded(self) -> bool:
        return self.database_url is None and self.broker_url is None


@lru_cache
def get_settings() -> Settings:
    return Settings()
