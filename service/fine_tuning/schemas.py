"""OpenAI's fine-tuning bodies (`openai.types.fine_tuning`), field for field, plus our own
extras (each response names the job behind it; the request takes our generation, LoRA and
queue options through the SDK's `extra_body`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from service.graders.schemas import STRING_CHECK_EXAMPLE
from workers.grpo.config import GenerationParams, LoraParams

Auto = Literal["auto"]
PositiveInt = Annotated[StrictInt, Field(ge=1, le=1_000_000)]


class ReinforcementHyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    batch_size: Auto | Annotated[StrictInt, Field(ge=1, le=4096)] = Field(
        "auto", description="Examples per step: our grpo.prompts_per_step."
    )
    compute_multiplier: Auto | Annotated[float, Field(gt=0, le=128)] = Field(
        "auto", description="Scales the group size G (8 × multiplier, 2 to 1024)."
    )
    eval_interval: Auto | PositiveInt = Field("auto", description="Our eval_every.")
    eval_samples: Auto | PositiveInt = Field(
        "auto", description="Kept, not applied: our evaluation is one greedy completion per record."
    )
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0, le=1e5)] = Field(
        "auto", description="Our learning_rate = 1e-5 × multiplier."
    )
    n_epochs: Auto | Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        "auto", description="Passes over the training file: steps = ceil(epochs × records / batch)."
    )
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = Field(
        None, description="Ignored: our models have no reasoning-effort setting."
    )


class ReinforcementMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: dict[str, Any] = Field(description="An OpenAI grader: it becomes our verifier.")
    hyperparameters: ReinforcementHyperparameters = Field(
        default_factory=ReinforcementHyperparameters
    )


class Method(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="`reinforcement`: the one method trained here.")
    reinforcement: ReinforcementMethod | None = None
    supervised: dict[str, Any] | None = None
    dpo: dict[str, Any] | None = None


class FineTuningJobCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "tiny",
                    "training_file": "file-0123456789abcdef",
                    "suffix": "digits",
                    "method": {
                        "type": "reinforcement",
                        "reinforcement": {
                            "grader": STRING_CHECK_EXAMPLE,
                            "hyperparameters": {"n_epochs": 2, "batch_size": 2},
                        },
                    },
                }
            ]
        },
    )

    model: str = Field(
        min_length=1, max_length=200, description="A catalog model, checkpoint or ft: model."
    )
    training_file: str = Field(min_length=1, max_length=200, description="`file-…` (or `ds_…`).")
    validation_file: str | None = Field(None, min_length=1, max_length=200)
    suffix: str | None = Field(None, pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    seed: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)] | None = Field(
        None, description="Drawn at random when omitted, as OpenAI does (then shown)."
    )
    method: Method | None = Field(None, description="Required here: only reinforcement trains.")
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(None, max_length=16)
    integrations: list[dict[str, Any]] | None = Field(
        None, max_length=16, description="Not supported: use our trackers (docs/trackers.md)."
    )
    hyperparameters: dict[str, Any] | None = Field(
        None, description="Deprecated by OpenAI: set method.reinforcement.hyperparameters."
    )
    # Ours, through the SDK's extra_body:
    generation: GenerationParams | None = Field(None, description="Our sampling options.")
    lora: LoraParams | None = Field(None, description="Train a LoRA adapter (default: full).")
    queue: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]{1,64}$")


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class SupervisedHyperparameters(BaseModel):
    batch_size: int | str | None = None
    learning_rate_multiplier: float | str | None = None
    n_epochs: int | str | None = None


class FineTuningJobOut(BaseModel):
    id: str = Field(description="`ftjob-…`: our job `job_…` under OpenAI's prefix.")
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobError | None
    fine_tuned_model: str | None = Field(description="Set once the job has succeeded.")
    finished_at: int | None
    hyperparameters: SupervisedHyperparameters
    model: str
    organization_id: str = Field(description="Your tenant.")
    result_files: list[str] = Field(default_factory=list)
    seed: int
    status: Literal[
        "validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"
    ]
    trained_tokens: int | None = Field(
        None, description="Tokens its recorded steps trained (our usage); null before the first."
    )
    training_file: str
    validation_file: str | None
    estimated_finish: int | None = Field(
        None,
        description="While running: now plus the remaining steps at the mean time of its last "
        "10 (Unix seconds); null otherwise, or before a step is timed.",
    )
    integrations: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None
    method: dict[str, Any]
    suffix: str | None = None
    job: str = Field(description="Our job (GET /v1/jobs/{id}, the dashboard).")
    job_status: str = Field(description="Our job's own status (cancelling, pausing, ...).")
    step: int
    total_steps: int


class FineTuningJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobOut]
    has_more: bool
    next: str | None = None


class FineTuningEventOut(BaseModel):
    id: str = Field(description="`ftevent-N`: our event N.")
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] = "message"
    event_type: str = Field(description="Our event's type (status, checkpoint, ...).")


class FineTuningEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningEventOut]
    has_more: bool


class CheckpointOut(BaseModel):
    id: str = Field(description="`ftckpt-…`: our checkpoint `ckpt_…` under OpenAI's prefix.")
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str = Field(
        description="Our checkpoint id: a `model` for chat completions and new jobs."
    )
    fine_tuning_job_id: str
    metrics: dict[str, float | None] = Field(
        description="The step's metrics: `step`, `train_loss`, and ours (reward_mean, ...)."
    )
    step_number: int


class CheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CheckpointOut]
    has_more: bool
