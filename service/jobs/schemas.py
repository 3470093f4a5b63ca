from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.schemas import UtcDateTime
from workers.grpo.config import TrainSpec

JobStatus = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]


class VerifierRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    version: int | None = Field(
        None, ge=1, le=2**31 - 1, description="Pinned to the latest when omitted."
    )
    weight: float = Field(1.0, ge=-1e6, le=1e6, allow_inf_nan=False)


class JobCreate(TrainSpec):
    """The engine's `TrainSpec` (model, grpo, generation, lora, cadence: declared once, with its
    validators) plus what the service resolves: datasets, verifiers and the queue."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "base_model": "/models/tiny-llama",
                    "dataset": "ds_0123456789abcdef",
                    "verifiers": [{"name": "has-digit", "weight": 1.0}],
                    "grpo": {"steps": 20, "prompts_per_step": 2, "group_size": 8},
                    "generation": {"max_new_tokens": 16},
                }
            ]
        },
    )

    dataset: str = Field(min_length=1, max_length=128, description="Training dataset id (ds_…).")
    eval_dataset: str | None = Field(None, max_length=128, description="Held-out dataset id.")
    verifiers: list[VerifierRef] = Field(min_length=1, max_length=16)
    eval_verifiers: list[VerifierRef] | None = Field(
        None, min_length=1, max_length=16, description="Defaults to verifiers."
    )
    queue: str = Field("gpu", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")


class JobErrorOut(BaseModel):
    code: str
    message: str


class JobOut(BaseModel):
    id: str
    status: JobStatus
    spec: dict[str, Any]
    step: int
    total_steps: int
    latest_metrics: dict[str, Any] | None
    error: JobErrorOut | None
    created_at: UtcDateTime
    started_at: UtcDateTime | None
    finished_at: UtcDateTime | None


class PinnedVerifier(BaseModel):
    name: str
    version: int
    weight: float
    sha256: str = Field(description="Of the version's kind+config: the exact code scored.")


class MetricsPage(BaseModel):
    data: list[dict[str, Any]] = Field(description="One row per step: {step, ...metrics}.")
    verifiers: list[PinnedVerifier] = Field(
        default_factory=list,
        description="The pinned verifier versions behind `reward/<name>` and `errors/<name>`.",
    )
    eval_verifiers: list[PinnedVerifier] = Field(
        default_factory=list, description="The pinned versions behind `eval_reward/<name>`."
    )


class EventOut(BaseModel):
    id: int
    at: UtcDateTime
    type: str
    message: str
    data: dict[str, Any]


class EventsPage(BaseModel):
    data: list[EventOut]


class CheckpointOut(BaseModel):
    id: str
    step: int
    size_bytes: int
    sha256: str
    format: Literal["full", "peft-adapter"]
    created_at: UtcDateTime


class CheckpointsPage(BaseModel):
    data: list[CheckpointOut]
