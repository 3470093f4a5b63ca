"""Process settings (pydantic-settings). Unset means the embedded default: SQLite, a local object
folder and a Celery broker that needs no server, all under `GRPO_DATA_DIR`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class QueueSettings(BaseModel):
    """One queue the operator runs workers for (`grpo-service worker --queue NAME`)."""

    device_memory_gib: float | None = Field(
        None, gt=0, description="Memory of one device of this queue's workers (unset: unchecked)."
    )
    step_timeout_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Wall-clock budget of one training step on this queue's workers; past it "
        "the worker kills the training process (unset: GRPO_STEP_TIMEOUT_S).",
    )
    device_flops: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Sustained FLOP/s of one device of this queue's workers, for "
        "POST /v1/jobs/estimate (unset: GRPO_ESTIMATE_DEVICE_FLOPS).",
    )


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
    lease_seconds: float = Field(
        60.0, gt=0, description="A worker's claim on a job lasts this long."
    )
    heartbeat_seconds: float = Field(10.0, gt=0, description="How often a worker renews its lease.")
    reconcile_seconds: float = Field(15.0, gt=0, description="How often the reconciler runs.")
    requeue_after_seconds: float = Field(
        60.0, gt=0, description="Re-enqueue a queued job whose message seems lost after this long."
    )
    max_attempts: int = Field(3, ge=1, description="Claims a job gets before it fails for good.")
    worker_devices: int = Field(
        1,
        ge=1,
        le=64,
        description="Devices a `grpo-service worker` owns (its --devices default): it trains "
        "jobs of resources.devices up to this many, one rank per device.",
    )
    step_timeout_s: float = Field(
        3600.0,
        gt=0,
        allow_inf_nan=False,
        description="A training step (and each checkpoint upload) must finish within this; past "
        "it the worker kills the training process. A queue's step_timeout_s overrides it.",
    )
    startup_timeout_s: float = Field(
        3600.0,
        gt=0,
        allow_inf_nan=False,
        description="From the training process's start to its first step (model download and "
        "load, resume checkpoint); past it the worker kills the training process.",
    )
    cancel_grace_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="A cancelled job's training process still running after this is killed.",
    )
    builtin_verifier_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="Per-batch deadline of the built-in verifier kinds (read from the "
        "environment by workers/verifiers/builtin_host.py).",
    )
    max_request_bytes: int = Field(
        64 << 20, ge=1, description="Largest accepted request body (counted as it streams in)."
    )
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
    queues: dict[str, QueueSettings] = Field(
        default_factory=lambda: {"gpu": QueueSettings()},
        description='Queues jobs may name, as JSON: {"gpu": {"device_memory_gib": 80}}.',
    )
    hf_token: SecretStr | None = Field(
        None, description="Hugging Face token for gated catalog models (`models add`, workers)."
    )
    hf_offline: bool = Field(
        False, description="Never reach the Hub: catalog models come from the HF_HOME cache."
    )
    allow_unsafe_verifiers: bool = Field(
        False, description="Run python verifiers without the bubblewrap sandbox (never in prod)."
    )
    max_python_sandboxes_per_job: int = Field(
        8,
        ge=1,
        description="Python sandboxes one job may open (python verifiers and python composite "
        "parts, of verifiers and eval_verifiers), and one `/test` call: 422 beyond.",
    )
    max_sandboxes_per_host: int = Field(
        64,
        ge=1,
        description="Python sandboxes running at once on one host, all processes together "
        "(read from the environment by workers/verifiers/slots.py).",
    )
    sandbox_cgroup: str | None = Field(
        None,
        description="A memory cgroup (v2: one delegating `memory`) to make each sandbox's in "
        "(read by workers/verifiers/cgroup.py); unset: the worker's own cgroup.",
    )

    # The API's exposure to hostile clients (issue 22 item 9).
    metrics_token: SecretStr | None = Field(
        None,
        description="Operator token for /metrics: when set, a scrape needs `Authorization: "
        "Bearer <token>` and also gets the job and queue gauges; unset, /metrics is open and "
        "holds the request metrics only.",
    )
    docs_enabled: bool = Field(
        True, description="Serve Swagger UI at /docs (from local files, never a CDN)."
    )
    auth_cache_entries: int = Field(
        10_000,
        ge=1,
        description="Valid API keys the in-process auth cache holds (least recently used "
        "evicted first); invalid keys are never cached.",
    )
    auth_failure_limit: int = Field(
        20,
        ge=1,
        description="Failed API-key attempts one client address may make per "
        "auth_failure_window_s, per API process; beyond, 429 with Retry-After.",
    )
    auth_failure_window_s: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="The window of auth_failure_limit."
    )
    # Request rate per API key (docs/rate-limits.md).
    rate_limit_per_minute: int = Field(
        0,
        ge=0,
        description="Requests one API key may make per minute, a token bucket refilled at "
        "this rate (0 = no limit); beyond, 429 with Retry-After and RateLimit-* headers.",
    )
    rate_limit_burst: int = Field(
        0,
        ge=0,
        description="Requests a key may make at once (the bucket's size); 0 = "
        "rate_limit_per_minute.",
    )
    redis_url: str | None = Field(
        None,
        description="Redis holding the rate-limit buckets, shared by every API process; unset: "
        "the broker's URL when it is redis:// or rediss://, else each process counts alone.",
    )
    http_keepalive_s: int = Field(
        5, ge=1, description="An idle keep-alive connection is closed after this (uvicorn)."
    )
    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="A request's line and headers must arrive within this from its first byte "
        "(or from the connection's opening); past it the connection is closed (408).",
    )
    http_body_timeout_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="The longest pause between two parts of a request body; past it the "
        "connection is closed.",
    )
    http_max_header_bytes: int = Field(
        32 << 10, ge=1024, description="Largest request line plus headers (431 beyond)."
    )
    http_limit_concurrency: int = Field(
        1000,
        ge=1,
        description="Connections plus running requests one API process takes at once; "
        "beyond, uvicorn answers 503.",
    )
    http_backlog: int = Field(
        2048, ge=1, description="Connections the kernel queues before the API accepts them."
    )

    # Pre-flight (docs/preflight.md): POST /v1/jobs/preflight and a job's `preflight: require`.
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

    # Trackers (docs/trackers.md): connection settings are the operator's, never a job's.
    secrets_key: SecretStr | None = Field(
        None,
        description="Fernet key(s) that encrypt tenant secrets, comma-separated (the first "
        "encrypts, all decrypt: rotation); unset in embedded mode: DATA_DIR/secrets.key.",
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI for report_to: mlflow (unset: refused)."
    )
    wandb_mode: Literal["online", "offline"] | None = Field(
        None, description="W&B mode; unset: online with a key (wandb_secret), else offline."
    )
    tracker_dir: Path | None = Field(
        None,
        description="Where workers keep W&B offline runs and Trackio's local store "
        "(unset: DATA_DIR/trackers).",
    )

    # Webhooks (docs/webhooks.md): sent by the dispatcher beside every reconciler.
    webhook_allow_private: bool = Field(
        False,
        description="Allow webhook URLs over http and targets in loopback, private, "
        "link-local and other non-public ranges (refused by default: SSRF).",
    )
    max_webhooks_per_tenant: int = Field(
        20, ge=1, description="Webhooks a tenant may have (429 beyond: delete some)."
    )
    webhook_timeout_s: float = Field(
        5.0, gt=0, allow_inf_nan=False, description="One delivery attempt's HTTP timeout."
    )
    webhook_max_attempts: int = Field(
        10, ge=1, description="Attempts of one delivery before it is marked failed."
    )
    webhook_max_age_s: float = Field(
        24 * 3600.0,
        gt=0,
        allow_inf_nan=False,
        description="A delivery not delivered this long after its event is marked failed.",
    )
    webhook_retry_base_s: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="Delay before the first retry; doubled at each retry, with jitter.",
    )
    webhook_retry_max_s: float = Field(
        3600.0, gt=0, allow_inf_nan=False, description="Longest delay between two attempts."
    )
    webhook_poll_s: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="How often the dispatcher looks for due deliveries.",
    )
    webhook_concurrency: int = Field(
        8, ge=1, description="Deliveries one dispatcher sends at once."
    )

    # Inference (docs/inference.md): /v1/chat/completions and /v1/completions, proxied.
    inference_url: str | None = Field(
        None,
        description="Base URL of the inference backend the API proxies to (`grpo-service serve` "
        "or an OpenAI-compatible server); unset: 503 (`up` sets it to its own serve).",
    )
    inference_backend: Literal["grpo", "openai"] = Field(
        "grpo",
        description="`grpo`: grpo-service serve; `openai`: an operator-run OpenAI-compatible "
        "server (vLLM, SGLang) serving catalog models under their catalog names.",
    )
    inference_token: SecretStr | None = Field(
        None,
        description="Shared secret the API sends to the backend as its bearer token; serve "
        "refuses every request without it (`up` makes one when unset).",
    )
    inference_timeout_s: float = Field(
        300.0, gt=0, allow_inf_nan=False, description="Longest wait for one backend answer."
    )
    inference_lora_dir: Path | None = Field(
        None,
        description="`openai` backend: a folder the backend also reads, where the API unpacks "
        "adapter checkpoints before /v1/load_lora_adapter (unset: adapters refused).",
    )
    inference_lora_backend_dir: str | None = Field(
        None,
        description="`openai` backend: the same folder as the backend sees it (its mount path), "
        "for the `lora_path` it is sent; unset: the API's own path (mounted alike).",
    )
    serve_max_models: int = Field(2, ge=1, description="Base models serve keeps loaded (LRU).")
    serve_max_adapters: int = Field(
        8, ge=1, description="LoRA adapters serve keeps loaded on one base (LRU)."
    )
    serve_batch_window_ms: float = Field(
        20.0, ge=0, allow_inf_nan=False, description="How long serve collects requests per batch."
    )
    serve_max_batch: int = Field(
        16, ge=1, description="Most sequences (choices) serve decodes in one batch."
    )
    serve_device: str | None = Field(None, description="serve's device (unset: cuda if any).")

    # Model judges (docs/verifiers.md, kind `judge`; score_model/label_model graders).
    judge_base_url: str | None = Field(
        None,
        description="OpenAI-compatible base URL (`.../v1`) model judges call; unset: the "
        "inference backend (GRPO_INFERENCE_URL).",
    )
    judge_token: SecretStr | None = Field(
        None, description="Bearer token sent to GRPO_JUDGE_BASE_URL."
    )
    judge_timeout_s: float = Field(
        120.0, gt=0, allow_inf_nan=False, description="Longest wait for one judge answer."
    )
    judge_concurrency: int = Field(
        4, ge=1, le=64, description="Judge calls one verifier has in flight at once."
    )
    judge_deadline_s: float = Field(
        600.0,
        gt=0,
        allow_inf_nan=False,
        description="Deadline for one batch of judge calls; unanswered items are errors.",
    )
    judge_allow_private: bool = Field(
        False,
        description="Let a tenant's judge endpoint (a secret's base_url) be http or resolve to "
        "a private address.",
    )

    # Usage (docs/usage.md): POST /v1/jobs/estimate without a measured basis.
    estimate_device_flops: float = Field(
        5e10,
        gt=0,
        allow_inf_nan=False,
        description="Sustained FLOP/s of one device, for estimates on queues without their "
        "own `device_flops`.",
    )

    def device_flops_for(self, queue: str) -> float:
        """The sustained FLOP/s an estimate assumes for one device of `queue`'s workers."""
        own = self.queues.get(queue)
        return own.device_flops if own and own.device_flops else self.estimate_device_flops

    def step_timeout_for(self, queue: str) -> float:
        """The step budget of `queue`'s workers: its own, else the global one."""
        own = self.queues.get(queue)
        return own.step_timeout_s if own and own.step_timeout_s else self.step_timeout_s

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
    def tracker_path(self) -> Path:
        return (self.tracker_dir or self.data_dir / "trackers").expanduser().resolve()

    @property
    def embedded(self) -> bool:
        return self.database_url is None and self.broker_url is None


@lru_cache
def get_settings() -> Settings:
    return Settings()
