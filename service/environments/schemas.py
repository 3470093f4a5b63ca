from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.registry.schemas import VersionCreate, VersionOut, with_example

# A /test call is a replay, not a workload: a few scripted episodes of a few turns each.
MAX_TEST_SAMPLES = 64
MAX_TEST_TURNS = 64  # as a job's environment.max_turns
MAX_TURN_CHARS = 100_000

CALCULATOR = '''\
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b

tools = [add]

def step(messages, record):
    said = messages[-1]["content"]
    return {"observation": None, "reward": float(record["answer"] in said), "done": True}
'''


class EnvironmentCreate(VersionCreate):
    model_config = with_example(
        name="calculator",
        kind="python",
        description="one turn with an add tool; 1.0 for the answer",
        config={"source": CALCULATOR, "timeout_s": 10},
    )

    kind: Literal["python"]
    config: dict[str, Any] = Field(
        description="`{source, timeout_s?}`: Python defining `step(messages, record)`, "
        "optionally `reset(record)` and `tools = [fn, ...]` (docs/environments.md); "
        "`timeout_s` is the per-batch deadline of its sandbox (default 10)."
    )


class EnvironmentOut(VersionOut):
    sha256: str = Field(
        description="SHA-256 of the canonical kind+config: traces episodes to code."
    )


class ScriptedSample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    record: dict[str, Any] = Field(description="A dataset record: `{prompt, ...fields}`.")
    turns: list[Annotated[str, Field(max_length=MAX_TURN_CHARS)]] = Field(
        min_length=1,
        max_length=MAX_TEST_TURNS,
        description="The assistant's turns, played in order (tool calls in the model's format).",
    )


class EnvironmentTestRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "samples": [
                        {"record": {"prompt": "What is 2+3?", "answer": "5"}, "turns": ["5"]}
                    ]
                }  # fmt: skip
            ]
        },
    )

    version: int | None = Field(None, ge=1, le=2**31 - 1, description="Default: the latest.")
    samples: list[ScriptedSample] = Field(min_length=1, max_length=MAX_TEST_SAMPLES)
    max_turns: int | None = Field(
        None,
        ge=1,
        le=MAX_TEST_TURNS,
        description="Assistant turns per episode at most (then truncated), as a job's "
        "`environment.max_turns`; default: the longest `turns` list.",
    )


class EpisodeOut(BaseModel):
    messages: list[dict[str, Any]] = Field(description="The transcript: `[{role, content}]`.")
    rewards: list[float] = Field(description="One reward per `step` call.")
    reward: float = Field(description="Their sum: the episode's reward.")
    errors: list[str] = Field(description="What went wrong in the episode (empty: nothing).")
    turns: int = Field(description="Assistant turns taken.")
    tool_calls: int
    tool_errors: int
    truncated: bool = Field(description="Cut at max_turns, or by the context.")


class EnvironmentTestResult(BaseModel):
    results: list[EpisodeOut]
    elapsed_ms: float
