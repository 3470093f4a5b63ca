from typing import Any, Literal

from pydantic import BaseModel, Field

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
