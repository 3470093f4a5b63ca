"""The seam between an environment's runtime and whoever plays the policy.

An episode is a transcript of OpenAI-style messages. The runtime (a sandboxed host process per
environment per job) answers `reset` and `step`, lists the source's tools and runs tool calls;
`episodes.run_episodes` drives the loop, turn by turn, for a batch of episodes. The policy is
the model while training (workers/grpo) and a scripted list of turns in `/test`: one loop, so
`/test` replays exactly what training does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}
Record = dict[str, Any]  # a dataset record; "prompt" is a string or a list of messages


@dataclass(frozen=True)
class StepResult:
    """What `step(messages, record)` returned for one episode, or the error it raised."""

    observation: str | None = None
    reward: float = 0.0
    done: bool = False
    error: str | None = None  # set when step raised or returned the wrong shape: ends the episode


@dataclass(frozen=True)
class ToolCall:
    """A call parsed from an assistant turn; `error` is set when the turn's call was malformed."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    error: str | None = None


class ToolError(str):
    """A tool message's content that is an error text: the call was malformed or the tool
    raised. It is still a `str` (the model reads it); the type lets the loop count it."""


class EnvironmentSession(Protocol):
    """One environment's host process, batched: every method takes and returns lists in order."""

    def tools(self) -> list[dict[str, Any]]:
        """The source's tools as OpenAI function tools ({"type": "function", "function": ...})."""
        ...

    def reset(self, records: list[Record]) -> list[str | list[Message] | BaseException]:
        """The first user turn for each record (the record's prompt when the source has none);
        a record whose prompt is a list of messages starts from those messages."""
        ...

    def step(self, batch: list[tuple[list[Message], Record]]) -> list[StepResult]: ...

    def call_tools(self, calls: list[ToolCall]) -> list[str]:
        """Each call's output as the `tool` message's content (a ToolError when it raised)."""
        ...

    def close(self) -> None: ...


class Policy(Protocol):
    """Plays the assistant: one turn for each transcript still going (in order); None for a
    transcript ends that episode (a scripted policy out of turns), without an error.

    Optional: `begin(transcripts, records)`, called once before the first `act` with the
    transcripts of the episodes that started and the index of each one's record; the loop then
    passes those same list objects (appended to) to every `act`.
    """

    def act(
        self, transcripts: list[list[Message]], tools: list[dict[str, Any]]
    ) -> list[str | None]: ...


@dataclass
class Episode:
    """One finished episode: the transcript, one reward per step call and their sum."""

    messages: list[Message]
    rewards: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    turns: int = 0  # assistant turns taken
    tool_calls: int = 0
    tool_errors: int = 0
    truncated: bool = False  # cut at max_turns, or by the context

    @property
    def reward(self) -> float:
        return float(sum(self.rewards))
