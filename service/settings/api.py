"""The API's exposure to hostile clients: HTTP limits, API-key auth, rate limits, metrics, docs."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class ApiSettings(BaseModel):
    """What one API process accepts and how fast (issue 22 item 9; docs/rate-limits.md)."""

    max_request_bytes: int = Field(
        64 << 20, ge=1, description="Largest accepted request body (counted as it streams in)."
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
    http_max_header_bytes: int = Field(
        32 << 10,
        ge=1024,
        description="Largest request line plus headers (400 beyond; uvicorn's h11).",
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
