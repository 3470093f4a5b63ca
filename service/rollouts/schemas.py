from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_INT = 2**31 - 1  # the database's integer, as service.core.pagination (which loads FastAPI)

Split = Literal["train", "eval"]


class RolloutOut(BaseModel):
    """One completion of a step (or of an eval run at that step), as the engine scored it."""

    id: str = Field(description="`{split}-{step}-{group}-{index}`; usable as `after`.")
    step: int
    split: Split
    group: int = Field(description="The group (prompt) within the step.")
    index: int = Field(description="The completion within its group.")
    record: int = Field(description="Index of the dataset record the prompt came from.")
    prompt: str = Field(description="The prompt as the model saw it (chat template applied).")
    messages: list[dict[str, Any]] | None = Field(
        description="The record's chat messages when it was chat-shaped."
    )
    completion: str
    reward: float
    scores: dict[str, float | None] = Field(description="Verifier name -> score (null: error).")
    advantage: float | None = Field(description="Group-relative advantage; null for eval.")
    length: int = Field(description="Completion tokens.")
    truncated: bool = Field(description="Cut at max_new_tokens.")
    finish_reason: Literal["stop", "length"]
    errors: dict[str, str] = Field(description="Verifier name -> error message.")


class RolloutFilters(BaseModel):
    step: int | None = None
    split: Split | None = None
    record: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    verifier_error: bool | None = None


class FromRollouts(BaseModel):
    """A dataset made from a job's stored rollouts (`POST /v1/datasets/from-rollouts`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"job_id": "job_…", "format": "dpo", "min_reward": 0.5}]},
    )

    job_id: str = Field(min_length=1, max_length=64, description="A job of yours.")
    format: Literal["sft", "dpo"] = Field(
        description="sft: `{prompt, completion, reward}` per completion; dpo: `{prompt, chosen, "
        "rejected}`, the best and worst completion of each group whose rewards differ."
    )
    split: Split = Field("train", description="Training rollouts, or those of eval runs.")
    steps: list[Annotated[int, Field(ge=1, le=MAX_INT)]] | None = Field(
        None, min_length=1, max_length=10_000, description="Only these steps; null: all."
    )
    min_reward: float | None = Field(
        None, allow_inf_nan=False,
        description="sft: only completions rewarded at least this; dpo: only groups whose best "
        "completion is.",
    )  # fmt: skip
    name: str | None = Field(
        None, min_length=1, max_length=200, description="Default: `{job_id}-{format}`."
    )
