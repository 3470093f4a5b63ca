from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.core.schemas import UtcDateTime
from service.jobs.schemas import JobErrorOut, VerifierRef
from workers.grpo.config import GenerationParams

EvaluationStatus = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]
MAX_SAMPLES_PER_PROMPT = 64


class EvaluationCreate(BaseModel):
    """Sample `model` on `dataset`, `samples_per_prompt` completions per record, and score
    every completion with `verifiers` (reward = the weighted sum of their scores, as in
    training)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "tiny-llama",
                    "dataset": "ds_0123456789abcdef",
                    "verifiers": [{"name": "math", "version": 2}],
                    "samples_per_prompt": 8,
                    "generation": {"max_new_tokens": 256, "temperature": 1.0},
                    "pass_threshold": 1.0,
                }
            ]
        },
    )

    model: str = Field(
        min_length=1,
        max_length=200,
        description="A catalog model, one of your checkpoints (ckpt_…) or fine-tuned models "
        "(ft:…).",
    )
    dataset: str = Field(min_length=1, max_length=200, description="A dataset id (or its name).")
    verifiers: list[VerifierRef] = Field(
        min_length=1, max_length=16, description="At least one; unpinned ones get the latest."
    )
    samples_per_prompt: int = Field(
        4,
        ge=1,
        le=MAX_SAMPLES_PER_PROMPT,
        description="Completions per record (n of pass@k); pass@k is reported for k = 1 and each "
        "power of two up to it.",
    )
    generation: GenerationParams | None = Field(
        None,
        description="Sampling settings; by default the job's own when `model` is a job's "
        "checkpoint (or its fine-tuned model), else the engine's defaults.",
    )
    pass_threshold: float = Field(
        1.0, allow_inf_nan=False, description="A sample passes when its reward is at least this."
    )
    max_records: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Evaluate only the dataset's first N records (at most GRPO_EVAL_MAX_RECORDS).",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Sampling seed.")
    queue: str = Field("gpu", min_length=1, max_length=64, description="The worker queue.")


class PassAtK(BaseModel):
    estimate: float = Field(description="Unbiased pass@k (Chen et al. 2021), mean over prompts.")
    low: float = Field(description="95% interval, low end.")
    high: float = Field(description="95% interval, high end.")


class EvaluationResults(BaseModel):
    reward_mean: float
    per_verifier: dict[str, float | None] = Field(
        description="Each verifier's mean score (its failed scores left out)."
    )
    pass_at_k: dict[str, PassAtK] = Field(description='By k: "1", "2", "4", ...')
    samples: int
    prompts: int
    completion_tokens: int
    verifier_errors: int = Field(description="Scores that failed (each counted 0 in the reward).")
    best_reward: float | None = Field(None, description="The highest reward of any sample.")
    none_passed: str | None = Field(
        None,
        description="Set when no sample reached pass_threshold: why (the threshold against the "
        "best reward seen).",
    )


class EvaluationUsage(BaseModel):
    device_seconds: float
    completion_tokens: int


class EvaluationOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "eval_0123456789abcdef",
                    "status": "succeeded",
                    "model": "tiny-llama",
                    "dataset": "ds_0123456789abcdef",
                    "samples_per_prompt": 4,
                    "pass_threshold": 1.0,
                    "results": {
                        "reward_mean": 0.4,
                        "per_verifier": {"math": 0.4},
                        "pass_at_k": {
                            "1": {"estimate": 0.4, "low": 0.3, "high": 0.5},
                            "2": {"estimate": 0.55, "low": 0.44, "high": 0.66},
                            "4": {"estimate": 0.7, "low": 0.6, "high": 0.8},
                        },
                        "samples": 80,
                        "prompts": 20,
                        "completion_tokens": 5120,
                        "verifier_errors": 0,
                    },
                }
            ]
        }
    )

    id: str
    object: Literal["evaluation"] = "evaluation"
    status: EvaluationStatus
    model: str
    dataset: str
    verifiers: list[dict[str, Any]] = Field(description="Pinned: name, version, weight, sha256.")
    samples_per_prompt: int
    generation: dict[str, Any]
    pass_threshold: float
    max_records: int | None
    records: int = Field(description="Records evaluated.")
    seed: int
    queue: str
    results: EvaluationResults | None = Field(description="Once `succeeded`.")
    error: JobErrorOut | None
    usage: EvaluationUsage
    created_at: UtcDateTime
    started_at: UtcDateTime | None
    finished_at: UtcDateTime | None


class EvaluationSampleOut(BaseModel):
    index: int = Field(description="Position: record by record, its k samples consecutive.")
    record: int = Field(description="The record's position in the dataset.")
    sample: int
    prompt: str
    completion: str
    reward: float
    scores: dict[str, float | None] = Field(description="Each verifier's score (null: failed).")
    errors: dict[str, str]
    length: int = Field(description="Completion tokens.")
    truncated: bool
    passed: bool = Field(description="reward >= pass_threshold.")
