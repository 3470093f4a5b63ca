"""OpenAI's grader endpoints' bodies (`openai.types.fine_tuning.alpha`), field for field."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonDict

STRING_CHECK_EXAMPLE: JsonDict = {
    "type": "string_check",
    "name": "answer matches",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


class GraderValidateRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"grader": STRING_CHECK_EXAMPLE}]}
    )

    grader: dict[str, Any] = Field(description="An OpenAI grader object (docs/verifiers.md).")


class GraderValidateResponse(BaseModel):
    grader: dict[str, Any] = Field(description="The grader, normalised (defaults filled).")


class GraderRunRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"grader": STRING_CHECK_EXAMPLE, "model_sample": "4", "item": {"answer": "4"}}
            ]
        },
    )

    grader: dict[str, Any]
    model_sample: str = Field(
        max_length=1 << 20, description="The `sample` namespace: output_text (and output_json)."
    )
    item: dict[str, Any] = Field(
        default_factory=dict, description="The dataset record: the `item` namespace."
    )


class GraderRunErrors(BaseModel):
    """OpenAI's error flags: `model_grader_parse_error` for a judge's answer with no score or
    label, `model_grader_server_error` (with details) for a judge that did not answer."""

    formula_parse_error: bool = False
    invalid_variable_error: bool = False
    model_grader_parse_error: bool = False
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    model_grader_server_error_details: str | None = None
    other_error: bool = False
    python_grader_runtime_error: bool = False
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = False


class GraderRunMetadata(BaseModel):
    name: str
    type: str
    errors: GraderRunErrors
    execution_time: float = Field(description="Seconds.")
    scores: dict[str, float] = Field(description="A multi grader's sub-grader scores by key.")
    token_usage: int | None = None
    sampled_model_name: str | None = None


class GraderRunResponse(BaseModel):
    reward: float = Field(description="0.0 when the grader failed on this sample (see errors).")
    metadata: GraderRunMetadata
    sub_rewards: dict[str, float]
    model_grader_token_usage_per_model: dict[str, Any] = Field(default_factory=dict)
