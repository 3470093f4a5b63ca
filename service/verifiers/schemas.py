from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.core.schemas import UtcDateTime

VerifierKind = Literal[
    "python",
    "exact_match",
    "regex",
    "numeric",
    "length",
    "json_schema",
    "composite",
    "openai_grader",
    "judge",
]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"


class VerifierCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "has-digit",
                    "kind": "python",
                    "description": "1.0 when the completion contains the answer",
                    "config": {
                        "source": "def verify(prompt, completion, answer, **kw):\n"
                        "    return float(str(answer) in completion)\n"
                    },
                }
            ]
        },
    )

    name: str = Field(pattern=NAME_PATTERN, description="Posting an existing name adds a version.")
    kind: VerifierKind
    description: str = Field("", max_length=2000)
    config: dict[str, Any] = Field(default_factory=dict)


class VerifierOut(BaseModel):
    id: str
    name: str
    version: int
    kind: str
    description: str
    config: dict[str, Any]
    sha256: str = Field(description="SHA-256 of the canonical kind+config: traces metrics to code.")
    created_at: UtcDateTime


class VerifierTestRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"samples": [{"prompt": "2+2=", "completion": "4", "answer": "4"}]}]
        },
    )

    version: int | None = Field(None, ge=1, description="Defaults to the latest version.")
    samples: list[dict[str, Any]] = Field(min_length=1, max_length=1000)


class VerifierTestResult(BaseModel):
    scores: list[float | None]
    errors: list[str | None]
    elapsed_ms: float
