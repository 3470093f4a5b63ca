"""`SandboxedEnvironment`: one environment's long-lived sandboxed process, for one job (or one
`/test` call).

The sandbox is the python verifiers' (bubblewrap, rlimits, seccomp, a memory cgroup, a host
slot: workers/verifiers/sandbox.py, process.py), driven by the same supervisor
(`sandbox_host.SandboxHost`); the bootstrap is given `_runtime.py` as its runtime, which speaks
the environment's requests (tools, reset, step, tool). Every call is one batch under the
config's `timeout_s`. When a batch breaks (a step hangs past the deadline, the process dies,
runs out of memory or breaks protocol) the whole sandbox is killed: the items answered keep
their results, the item it was on gets the failure as its error, and the rest go again to a
fresh sandbox (the source is stateless between calls, so nothing is lost). Failures and wall
time count against a per-job budget; past it the job fails with EnvironmentBudgetExceeded.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from workers.verifiers import ChildLimits, VerifierBudgetExceeded
from workers.verifiers.budget import Budget
from workers.verifiers.process import ProtocolError
from workers.verifiers.sandbox import require_sandbox
from workers.verifiers.sandbox_host import SandboxHost, SandboxStats

from .config import EnvironmentConfig, check_source
from .protocol import Message, Record, StepResult, ToolCall, ToolError

RUNTIME_SOURCE = (Path(__file__).parent / "_runtime.py").read_text()
DEFAULT_BUDGET_S = 6 * 3600.0  # wall time in the sandbox per job, summed over calls
DEFAULT_MAX_FAILURES = 20  # broken batches (timeouts, crashes) per job before it fails
# Characters of one observation, first turn or tool output: the runtime's own `MAX_TEXT`,
# checked again here. The runtime's check runs on the tenant's objects, and a `str` subclass
# can lie about its length (`__len__` returning 0) while JSON carries every character.
MAX_TEXT = 1_000_000
Outcome = tuple[Any, str | None]  # (the runtime's JSON value, None) or (None, error)


class EnvironmentBudgetExceeded(RuntimeError):  # noqa: N818 - mirrors VerifierBudgetExceeded
    """The environment spent its per-job budget; the job must fail with this message."""

    def __init__(self, environment: str, cause: str):
        self.environment, self.cause = environment, cause
        super().__init__(f"environment {environment!r} exceeded its budget: {cause}")


def first_turn(record: Record) -> str | list[Message]:
    """The default `reset`: the record's prompt, a string or a list of messages used as is."""
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_message(m) for m in prompt):
        return [dict(m) for m in prompt]
    raise ValueError("the record's 'prompt' must be a string or a list of {role, content}")


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and all(isinstance(m.get(k), str) for k in ("role", "content"))


class SandboxedEnvironment:
    """EnvironmentSession over a sandboxed source; thread-safe (calls are serialised)."""

    def __init__(
        self,
        config: EnvironmentConfig,
        *,
        name: str = "environment",
        limits: ChildLimits | None = None,
        mode: str | None = None,
        budget_s: float = DEFAULT_BUDGET_S,
        max_failures: int = DEFAULT_MAX_FAILURES,
    ) -> None:
        self.name, self.config = name, config
        self.info = check_source(config.source)
        self.mode = mode or require_sandbox()  # refuses before anything runs
        self.stats = SandboxStats()
        self.budget = Budget(budget_s, max_failures)
        init = {"source": config.source, "entry": "step", "runtime": RUNTIME_SOURCE}
        limits = limits or ChildLimits()
        self.host = SandboxHost(self.mode, init, limits, what="environment", stats=self.stats)
        self._tools: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> SandboxedEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.host.kill()

    # ---------------------------------------------------------------- EnvironmentSession

    def tools(self) -> list[dict[str, Any]]:
        """The tools' schemas, computed in the sandbox once; raises RuntimeError when the
        source cannot produce them (it fails to load, or a type hint has no JSON schema)."""
        if not self.info.tools:
            return []
        if self._tools is None:
            [(value, error)] = self._call([{"op": "tools"}])
            if error is not None:
                raise RuntimeError(f"environment {self.name!r}: cannot list its tools: {error}")
            if not (isinstance(value, list) and all(_is_tool(t) for t in value)):
                raise RuntimeError(f"environment {self.name!r}: malformed tool schemas")
            self._tools = value
        return self._tools

    def reset(self, records: list[Record]) -> list[str | list[Message] | BaseException]:
        out: list[str | list[Message] | BaseException] = []
        send: list[int] = []
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                out.append(ValueError(f"a record must be an object, not {type(record).__name__}"))
            elif self.info.has_reset:
                out.append(ValueError("no result"))
                send.append(i)
            else:
                try:
                    out.append(first_turn(record))
                except ValueError as exc:
                    out.append(exc)
        if send:
            outcomes = self._call([{"op": "reset", "record": records[i]} for i in send])
            for i, (value, error) in zip(send, outcomes, strict=True):
                if error is None and not isinstance(value, str):
                    error = "environment protocol violation: malformed reset result"
                elif error is None:
                    error = too_long(value, "reset's result")
                out[i] = ValueError(f"reset failed: {error}") if error is not None else value
        return out

    def step(self, batch: list[tuple[list[Message], Record]]) -> list[StepResult]:
        items = [{"op": "step", "messages": m, "record": r} for m, r in batch]
        return [_step_result(v, e) for v, e in self._call(items)]

    def call_tools(self, calls: list[ToolCall]) -> list[str]:
        out: list[str] = [ToolError(c.error) if c.error is not None else "" for c in calls]
        send = [i for i, c in enumerate(calls) if c.error is None]
        items = [{"op": "tool", "name": c.name, "arguments": c.arguments} for c in calls]
        items = [items[i] for i in send]
        for i, (value, error) in zip(send, self._call(items) if items else [], strict=True):
            if error is not None:
                out[i] = ToolError(f"error: {error}")
            elif not (isinstance(value, dict) and isinstance(value.get("output"), str)):
                out[i] = ToolError("error: environment protocol violation: malformed tool output")
            elif long := too_long(value["output"], "the tool's output"):
                out[i] = ToolError(f"error: {long}")
            else:
                out[i] = ToolError(value["output"]) if value.get("error") else value["output"]
        return out

    # ---------------------------------------------------------------- batches

    def _call(self, items: list[dict[str, Any]]) -> list[Outcome]:
        """Run requests in the sandbox, in order; one (value, error) per request."""
        outcomes: list[Outcome | None] = [None] * len(items)
        payload: dict[int, bytes] = {}
        for i, item in enumerate(items):  # one bad record must not sink the batch
            try:
                payload[i] = json.dumps(item, allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                outcomes[i] = (None, f"not JSON-serialisable: {exc}"[:500])
        with self._lock:
            if self._closed:
                raise RuntimeError(f"environment {self.name!r} is closed")
            pending = list(payload)
            while pending:
                self._check_budget()
                pending = self._run_round(pending, payload, outcomes)
            self._check_budget()
        return [o if o is not None else (None, "no result") for o in outcomes]

    def _run_round(
        self, pending: list[int], payload: dict[int, bytes], outcomes: list[Outcome | None]
    ) -> list[int]:
        """One batch on the sandbox; returns the requests to send again to a fresh one."""
        started = time.monotonic()
        results, failure = self.host.run(
            [payload[i] for i in pending],
            timeout_s=self.config.timeout_s,
            budget=self.budget,
            accept=_accept,
        )
        self.budget.charge(time.monotonic() - started, failure)
        unanswered = [i for i, r in zip(pending, results, strict=True) if r is None]
        for i, r in zip(pending, results, strict=True):
            if r is not None:
                outcomes[i] = r
        if failure is None or not unanswered:
            return []
        if not self.host.loaded or self.budget.remaining_s() <= 0:  # no retry can do better
            for i in unanswered:
                outcomes[i] = (None, failure)
            return []
        outcomes[unanswered[0]] = (None, failure)  # the one it was on when the batch broke
        return unanswered[1:]

    def _check_budget(self) -> None:
        try:
            self.budget.check(self.name)
        except VerifierBudgetExceeded as exc:
            raise EnvironmentBudgetExceeded(self.name, exc.cause) from None


def too_long(text: str, what: str) -> str | None:
    """The runtime's length refusal, on the host's plain `str` decoded from the sandbox's JSON."""
    if len(text) > MAX_TEXT:
        return f"{what} is {len(text)} characters; the limit is {MAX_TEXT}"
    return None


def _accept(item: list[Any]) -> Outcome:
    tag = item[1] if len(item) > 1 else None
    if tag == "j" and len(item) == 3:
        return item[2], None
    if tag == "e" and len(item) == 3:
        return None, str(item[2])[:500]
    raise ProtocolError("malformed result")


def _is_tool(t: Any) -> bool:
    fn = t.get("function") if isinstance(t, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str) and t.get("type") == "function"


def _step_result(value: Any, error: str | None) -> StepResult:
    if error is not None:
        return StepResult(error=f"step failed: {error}")
    if isinstance(value, dict):  # what the runtime checked, checked again: it is not trusted
        obs, reward, done = value.get("observation"), value.get("reward"), value.get("done")
        if (
            (obs is None or isinstance(obs, str))
            and isinstance(reward, int | float)
            and not isinstance(reward, bool)
            and math.isfinite(reward)
            and isinstance(done, bool)
        ):
            if obs is not None and (long := too_long(obs, "step's observation")):
                return StepResult(error=f"step failed: {long}")
            return StepResult(observation=obs, reward=float(reward), done=done)
    return StepResult(error="step failed: environment protocol violation: malformed step result")
