"""Inference (docs/inference.md) and model judges (docs/verifiers.md, kind `judge`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class InferenceSettings(BaseModel):
    """The backend the API proxies /v1/chat/completions and /v1/completions to, `serve`'s own
    limits, and the endpoint model judges (score_model/label_model graders too) call."""

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
    inference_concurrency: int = Field(
        16,
        ge=1,
        description="Inference requests of all tenants in flight at once in one API process; "
        "more wait in their tenants' queues, each freed slot going to the next tenant in turn.",
    )
    inference_tenant_concurrency: int = Field(
        4,
        ge=1,
        description="Inference requests of one tenant in flight at once in one API process (a "
        "stream until it ends); more wait in the tenant's queue.",
    )
    inference_tenant_queue: int | None = Field(
        None,
        ge=0,
        description="Inference requests of one tenant waiting for a slot in one API process; "
        "one more is a 429 with Retry-After. Unset: GRPO_INFERENCE_TENANT_CONCURRENCY; 0: none.",
    )
    inference_queue_wait_s: float = Field(
        5.0,
        ge=0,
        allow_inf_nan=False,
        description="Longest wait of a queued inference request for a slot; then a 429 with "
        "Retry-After.",
    )
    inference_max_tokens_per_request: int = Field(
        16384,
        ge=1,
        description="Completion tokens one inference request may ask for: its cap times its "
        "choices (max_tokens × n, × prompts); over it, a 422 naming the cap's field.",
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
