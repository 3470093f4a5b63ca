"""The episode loop: the ONE loop both training (workers/grpo) and `/test` run.

For a batch of records: reset -> [user]; then, turn by turn, for the episodes still going:
  policy.act -> append the assistant message (turns += 1);
  tool calls in it? run them (malformed ones answer with their error text), append one `tool`
    message per call {role: "tool", tool_call_id, name, content} and let the policy act again
    (a tool round is a turn toward max_turns);
  none? step(messages, record) -> add the reward; done ends the episode; a non-empty
    observation is appended as the next user turn.
An episode ends on done, on a step error, when the policy has no more turns (None), or at
max_turns (truncated). A tool output or observation that would take the transcript past
`max_chars` is not appended: the episode is truncated with an error. The transcript is
append-only, so the engine can tell, per episode, which messages followed each assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .protocol import EnvironmentSession, Episode, Message, Policy, Record, ToolError
from .tools import parse_tool_calls


def run_episodes(
    session: EnvironmentSession,
    records: list[Record],
    policy: Policy,
    max_turns: int,
    max_chars: int | None = None,
) -> list[Episode]:
    """Play one episode per record, all in lock-step batches; episodes come back in order."""
    tools = session.tools()
    episodes: list[Episode] = []
    live: list[int] = []
    for i, first in enumerate(session.reset(records)):
        if isinstance(first, BaseException):
            episodes.append(Episode(messages=[], errors=[str(first)]))
            continue
        messages = [{"role": "user", "content": first}] if isinstance(first, str) else first
        episodes.append(Episode(messages=list(messages)))
        live.append(i)
    begin = getattr(policy, "begin", None)  # optional: which record each transcript is
    if callable(begin):
        begin([episodes[i].messages for i in live], live)
    while live:
        turns = policy.act([episodes[i].messages for i in live], tools)
        if len(turns) != len(live):
            raise ValueError(f"the policy answered {len(turns)} turns for {len(live)} episodes")
        calling: list[tuple[int, list[Any]]] = []
        stepping: list[int] = []
        for i, text in zip(live, turns, strict=True):
            if text is None:  # the policy has nothing more to say: the episode just ends
                continue
            ep = episodes[i]
            ep.messages.append({"role": "assistant", "content": text})
            ep.turns += 1
            calls = parse_tool_calls(text, tools, call_id=f"call_{ep.turns}")
            (calling.append((i, calls)) if calls else stepping.append(i))
        going = _run_tool_round(session, episodes, calling, max_chars)
        going += _run_step_round(session, episodes, records, stepping, max_chars)
        live = []
        for i in sorted(going):
            if episodes[i].turns >= max_turns:
                episodes[i].truncated = True
            else:
                live.append(i)
    return episodes


def _run_tool_round(
    session: EnvironmentSession,
    episodes: list[Episode],
    calling: list[tuple[int, list[Any]]],
    max_chars: int | None,
) -> list[int]:
    """Run every call of this round in one batch; returns the episodes that go on."""
    if not calling:
        return []
    outputs = iter(session.call_tools([c for _, calls in calling for c in calls]))
    going = []
    for i, calls in calling:
        ep = episodes[i]
        ep.tool_calls += len(calls)
        fits = True
        for call in calls:
            output = next(outputs)
            ep.tool_errors += isinstance(output, ToolError)
            message = {"role": "tool", "tool_call_id": call.id, "name": call.name}
            if fits and not _fits(ep, output, max_chars, f"the output of tool {call.name!r}"):
                fits = False
            if fits:
                ep.messages.append({**message, "content": output})
        if fits:
            going.append(i)
    return going


def _run_step_round(
    session: EnvironmentSession,
    episodes: list[Episode],
    records: list[Record],
    stepping: list[int],
    max_chars: int | None,
) -> list[int]:
    """Call step for every episode whose last turn called no tool; the episodes that go on."""
    if not stepping:
        return []
    results = session.step([(episodes[i].messages, records[i]) for i in stepping])
    going = []
    for i, result in zip(stepping, results, strict=True):
        ep = episodes[i]
        if result.error is not None:
            ep.errors.append(result.error)
            continue
        ep.rewards.append(result.reward)
        if result.done:
            continue
        if result.observation:
            if not _fits(ep, result.observation, max_chars, "the observation"):
                continue
            ep.messages.append({"role": "user", "content": result.observation})
        going.append(i)
    return going


def _fits(ep: Episode, text: str, max_chars: int | None, what: str) -> bool:
    """False (and the episode truncated, with an error) when `text` would overflow it."""
    if max_chars is None:
        return True
    used = sum(len(str(m.get("content") or "")) for m in ep.messages)
    if used + len(text) <= max_chars:
        return True
    ep.truncated = True
    ep.errors.append(
        f"{what} ({len(text)} characters) would take the transcript to {used + len(text)} "
        f"characters, past the context's {max_chars}: episode truncated"
    )
    return False


class ScriptedPolicy:
    """The policy of `/test`: sample k's turns, in order, for record k; a sample out of turns
    ends its episode (not an error). `begin` tells it which record each transcript is (by
    identity: the loop keeps the transcript objects and drops finished ones from the batch)."""

    def __init__(self, turns_per_sample: Sequence[Sequence[str]]) -> None:
        self._turns = [list(t) for t in turns_per_sample]
        self._sample: dict[int, int] = {}  # id(transcript) -> sample
        self._used = [0] * len(self._turns)

    def begin(self, transcripts: list[list[Message]], records: list[int]) -> None:
        self._sample = {id(t): k for t, k in zip(transcripts, records, strict=True)}

    def act(
        self, transcripts: list[list[Message]], tools: list[dict[str, Any]]
    ) -> list[str | None]:
        out: list[str | None] = []
        for transcript in transcripts:
            sample = self._sample[id(transcript)]
            used = self._used[sample]
            turns = self._turns[sample]
            out.append(turns[used] if used < len(turns) else None)
            self._used[sample] = used + 1
        return out
