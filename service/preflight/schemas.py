from typing import Any, Literal

from pydantic import BaseModel, Field

from service.core.schemas import UtcDateTime
from service.jobs.schemas import JobErrorOut

PreflightStatus = Literal["queued", "running", "succeeded", "failed"]


class PreflightWarningOut(BaseModel):
    code: str = Field(
        description="`all_groups_zero_spread` (fatal), `most_groups_zero_spread`, "
        "`verifier_errors` (fatal), `most_truncated`."
    )
    message: str
    fatal: bool = Field(description='A job with `preflight: "require"` refuses itself on it.')


class PreflightSample(BaseModel):
    group: int = Field(description="The prompt's group: its G completions are consecutive.")
    prompt: str
    completion: str
    reward: float
    scores: dict[str, float | None] = Field(description="Each verifier's score (null: failed).")
    errors: dict[str, str] = Field(description="The verifiers that failed on it, and why.")
    length: int = Field(description="Completion tokens.")
    truncated: bool = Field(description="Cut at max_new_tokens.")


class PreflightOut(BaseModel):
    """A pre-flight: its state, and once `succeeded` the figures of one real GRPO step of the
    spec on `prompts` prompts x `group_size` completions (null until then)."""

    model_config = {
        "json_schema_extra": {
            "examples": [
                {
                    "id": "pf_0123456789abcdef",
                    "status": "succeeded",
                    "queue": "gpu",
                    "reward_mean": 0.5,
                    "reward_std": 0.0,
                    "zero_std_fraction": 1.0,
                    "verifier_error_rate": 0.0,
                    "truncated_fraction": 0.25,
                    "completion_len_mean": 12.5,
                    "seconds_per_step_estimate": 3.2,
                    "warnings": [
                        {
                            "code": "all_groups_zero_spread",
                            "message": "all groups score the same; GRPO learns nothing from them",
                            "fatal": True,
                        }
                    ],
                }
            ]
        }
    }

    id: str
    status: PreflightStatus
    queue: str
    spec: dict[str, Any] = Field(description="The spec as a job would store it (pins included).")
    error: JobErrorOut | None = Field(
        None, description="Why it failed: `preflight_timeout`, `model_load_error`, ..."
    )
    reward_mean: float | None = None
    reward_std: float | None = None
    zero_std_fraction: float | None = Field(
        None, description="Share of groups whose rewards are all equal (no learning signal)."
    )
    verifier_error_rate: float | None = Field(
        None, description="Failed scores / (completions x verifiers)."
    )
    truncated_fraction: float | None = Field(None, description="Completions cut at the cap.")
    completion_len_mean: float | None = Field(None, description="Mean completion tokens.")
    seconds_per_step_estimate: float | None = Field(
        None, description="The measured step scaled to the spec's prompts_per_step."
    )
    step_seconds: float | None = Field(None, description="The measured step, at `prompts`.")
    prompts: int | None = None
    group_size: int | None = None
    peak_memory_bytes: int | None = Field(None, description="Measured during the step.")
    reward_by_verifier: dict[str, float] | None = None
    memory_estimate: dict[str, int] | None = Field(
        None, description="The job's memory plan, as POST /v1/jobs computes it (bytes by part)."
    )
    warnings: list[PreflightWarningOut] = Field(default_factory=list)
    samples: list[PreflightSample] = Field(
        default_factory=list, description="Completions of the step, whole groups first (≤ 64)."
    )
    created_at: UtcDateTime
    started_at: UtcDateTime | None
    finished_at: UtcDateTime | None
