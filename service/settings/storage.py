"""Where state lives: the data folder, the database and its pool, the broker, object storage."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class StorageSettings(BaseModel):
    """Unset means the embedded default: SQLite, a local object folder and a Celery broker that
    needs no server, all under `GRPO_DATA_DIR`."""

    data_dir: Path = Field(Path(".grpo"), description="Root of every embedded-mode file.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; unset = SQLite.")
    broker_url: str | None = Field(None, description="Celery broker URL; unset = filesystem.")
    storage_url: str | None = Field(None, description="file://PATH or s3://bucket[/prefix].")
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto).")
    s3_region: str | None = Field(None, description="S3 region.")
    s3_access_key_id: str | None = Field(None, description="S3 access key id.")
    s3_secret_access_key: str | None = Field(None, description="S3 secret access key.")
    s3_create_bucket: bool = Field(False, description="Create the bucket at start-up if missing.")

    db_pool_size: int = Field(10, ge=1, description="Database connections each process keeps open.")
    db_max_overflow: int = Field(
        30, ge=0, description="Connections opened beyond the pool at a burst, then closed."
    )
    db_pool_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="How long a request waits for a connection; then 503 with Retry-After.",
    )
    download_redirect: bool = Field(
        False, description="Answer checkpoint downloads with a 307 to a presigned URL (S3)."
    )
    download_url_expires_s: int = Field(300, ge=1, description="Presigned download URL lifetime.")

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
