from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.registry.schemas import VersionCreate, VersionOut, with_example

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


class VerifierCreate(VersionCreate):
    model_config = with_example(
        name="has-digit",
        kind="python",
        description="1.0 when the completion contains the answer",
        config={
            "source": "def verify(prompt, completion, answer, **kw):\n"
            "    return float(str(answer) in completion)\n"
        },
    )

    kind: VerifierKind


class VerifierOut(VersionOut):
    sha256: str = Field(description="SHA-256 of the canonical kind+config: traces metrics to code.")


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
