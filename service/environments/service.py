"""Environments: their registry (`service.registry`: immutable, numbered versions per
(tenant, name), as verifiers), the config check, the `/test` replay, and the pinned version a
job's worker opens."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from service.core.db import session_scope
from service.core.problems import FieldError, ProblemError, invalid, json_path
from service.core.pydantic_errors import field_message
from service.core.quotas import check_environment_quota
from service.environments.schemas import (
    EnvironmentCreate,
    EnvironmentTestRequest,
    EnvironmentTestResult,
    EpisodeOut,
)
from service.models import EnvironmentVersion
from service.registry.service import Registry
from service.settings import Settings
from workers.environments.config import EnvironmentConfig
from workers.environments.episodes import ScriptedPolicy, run_episodes
from workers.environments.host import EnvironmentBudgetExceeded, SandboxedEnvironment
from workers.verifiers import SandboxUnavailableError

# A /test call's own budget in its sandbox (wall seconds, summed over batches, and broken
# batches): a source that hangs on every sample is cut off, not run for samples x timeout_s.
TEST_BUDGET_S = 60.0
TEST_MAX_FAILURES = 8
TEST_MAX_CHARS = 200_000  # of one transcript: the response stays a few MB at most


def _checked_config(
    session: Session, tenant_id: str, body: EnvironmentCreate, settings: Settings
) -> dict[str, Any]:
    """The stored config (defaults filled in), or a 422 naming each bad field under
    `$.config`: the source is compiled and its contract checked, never run, here."""
    try:
        checked = EnvironmentConfig.model_validate(body.config)
    except ValidationError as exc:
        raise invalid(
            [
                FieldError(
                    path=json_path(("body", "config", *e["loc"])),
                    message=field_message(e, EnvironmentConfig),
                )
                for e in exc.errors()
            ]
        ) from None
    return checked.model_dump()


ENVIRONMENTS: Registry[EnvironmentVersion] = Registry(
    model=EnvironmentVersion,
    what="environment",
    id_prefix="env",
    check_quota=check_environment_quota,
    check_config=_checked_config,
)


def load_pinned(tenant_id: str, name: str, version: int) -> EnvironmentConfig:
    """The config of a job's pinned environment version, for the worker (service/training/runner.py)
    to open its sandbox with. LookupError when the version is gone."""
    with session_scope() as session:
        row = ENVIRONMENTS.find(session, tenant_id, name, version)
        if row is None:
            raise LookupError(f"environment {name} version {version} is gone")
        return EnvironmentConfig.model_validate(row.config)


def run_test(
    session: Session, row: EnvironmentVersion, body: EnvironmentTestRequest
) -> EnvironmentTestResult:
    """Replay each sample's scripted turns through `run_episodes` on the sandboxed source,
    exactly as training plays the model's turns. Everything needed is read first and the
    session's connection released before tenant code runs (as the verifiers' /test)."""
    config = EnvironmentConfig.model_validate(row.config)
    name = f"{row.name}@{row.version}"
    session.close()  # back to the pool; the request's unit of work commits nothing after it
    records = [sample.record for sample in body.samples]
    max_turns = body.max_turns or max(len(sample.turns) for sample in body.samples)
    policy = ScriptedPolicy([sample.turns for sample in body.samples])
    started = time.perf_counter()
    try:
        # Opened and played on this one thread: the sandbox dies with the thread that made it.
        with SandboxedEnvironment(
            config, name=name, budget_s=TEST_BUDGET_S, max_failures=TEST_MAX_FAILURES
        ) as env:
            _list_tools(env)
            episodes = run_episodes(env, records, policy, max_turns, max_chars=TEST_MAX_CHARS)
    except SandboxUnavailableError as exc:
        raise ProblemError(503, "Sandbox Unavailable", str(exc)) from exc
    except EnvironmentBudgetExceeded as exc:
        raise ProblemError(
            422, "Environment Budget Exceeded", f"{exc} (a /test call's budget)"
        ) from None
    elapsed_ms = (time.perf_counter() - started) * 1000
    results = [
        EpisodeOut(
            messages=ep.messages,
            rewards=ep.rewards,
            reward=ep.reward,
            errors=ep.errors,
            turns=ep.turns,
            tool_calls=ep.tool_calls,
            tool_errors=ep.tool_errors,
            truncated=ep.truncated,
        )
        for ep in episodes
    ]
    return EnvironmentTestResult(results=results, elapsed_ms=round(elapsed_ms, 3))


def _list_tools(env: SandboxedEnvironment) -> None:
    """The tools' schemas, computed in the sandbox (then cached for the loop): a source whose
    tools cannot be listed answers a 422 naming it, before any episode."""
    try:
        env.tools()
    except EnvironmentBudgetExceeded:
        raise
    except RuntimeError as exc:
        raise invalid([FieldError(path="path.name", message=str(exc))]) from None
