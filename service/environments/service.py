"""Environment registry: immutable, numbered versions per (tenant, name), as verifiers; the
`/test` replay; and the pinned version a job's worker opens."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from service.core.db import session_scope
from service.core.problems import FieldError, ProblemError, invalid, json_path, not_found
from service.core.quotas import check_environment_quota
from service.environments.schemas import (
    EnvironmentCreate,
    EnvironmentTestRequest,
    EnvironmentTestResult,
    EpisodeOut,
)
from service.models import EnvironmentVersion
from service.settings import Settings
from service.verifiers.service import append_version, version_lookup, version_params
from workers.environments.config import EnvironmentConfig
from workers.environments.episodes import ScriptedPolicy, run_episodes
from workers.environments.host import EnvironmentBudgetExceeded, SandboxedEnvironment
from workers.verifiers import SandboxUnavailableError

# A /test call's own budget in its sandbox (wall seconds, summed over batches, and broken
# batches): a source that hangs on every sample is cut off, not run for samples x timeout_s.
TEST_BUDGET_S = 60.0
TEST_MAX_FAILURES = 8
TEST_MAX_CHARS = 200_000  # of one transcript: the response stays a few MB at most

_ROW = version_lookup(EnvironmentVersion, EnvironmentVersion)
_PIN = version_lookup(
    EnvironmentVersion,
    EnvironmentVersion.name,
    EnvironmentVersion.version,
    EnvironmentVersion.sha256,
)


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """The stored config (defaults filled in), or a 422 naming each bad field under
    `$.config`: the source is compiled and its contract checked, never run, here."""
    try:
        checked = EnvironmentConfig.model_validate(config)
    except ValidationError as exc:
        raise invalid(
            [
                FieldError(
                    path=json_path(("body", "config", *e["loc"])),
                    message=e["msg"].removeprefix("Value error, "),
                )
                for e in exc.errors()
            ]
        ) from None
    return checked.model_dump()


def create_version(
    session: Session, tenant_id: str, body: EnvironmentCreate, settings: Settings
) -> EnvironmentVersion:
    check_environment_quota(session, settings, tenant_id)
    config = validate_config(body.config)
    return append_version(session, EnvironmentVersion, "env", tenant_id, body, config)


def find_version(
    session: Session, tenant_id: str, name: str, version: int | None = None
) -> EnvironmentVersion | None:
    stmt = _ROW[0] if version is None else _ROW[1]
    return session.scalar(stmt, version_params(tenant_id, name, version))


def get_version(
    session: Session, tenant_id: str, name: str, version: int | None = None
) -> EnvironmentVersion:
    row = find_version(session, tenant_id, name, version)
    if row is None:
        raise not_found("environment", name if version is None else f"{name}@{version}")
    return row


def pin(session: Session, tenant_id: str, name: str, version: int | None) -> tuple[int, str] | None:
    """(version, sha256) of a tenant's environment, the latest when `version` is None; None
    when the tenant has no such environment (another tenant's included)."""
    stmt = _PIN[0] if version is None else _PIN[1]
    row = session.execute(stmt, version_params(tenant_id, name, version)).first()
    return None if row is None else (row.version, row.sha256)


def load_pinned(tenant_id: str, name: str, version: int) -> EnvironmentConfig:
    """The config of a job's pinned environment version, for the worker (service/training/runner.py)
    to open its sandbox with. LookupError when the version is gone."""
    with session_scope() as session:
        row = find_version(session, tenant_id, name, version)
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
