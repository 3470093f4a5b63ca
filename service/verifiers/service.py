"""Verifiers: their registry (`service.registry`: immutable, numbered versions per (tenant,
name)), the config check at registration, composites' resolver and the `/test` scoring."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from service.core.problems import FieldError, ProblemError, invalid
from service.core.quotas import check_verifier_quota
from service.judges.checks import judge_errors
from service.judges.endpoints import judge_context
from service.models import VerifierVersion
from service.registry.service import Registry
from service.settings import Settings
from service.verifiers.schemas import VerifierCreate, VerifierTestRequest, VerifierTestResult
from workers.verifiers import (
    Resolver,
    SandboxUnavailableError,
    VerifierConfigError,
    open_verifier,
    pin_composite,
    validate_config,
)


def _checked_config(
    session: Session, tenant_id: str, body: VerifierCreate, settings: Settings
) -> dict[str, Any]:
    """The config to store (a composite's parts pinned to exact versions), or a 422 naming
    each bad field under `$.config` (a judge's model or secret this tenant cannot use too)."""
    try:
        config = validate_config(body.kind, body.config)
        if body.kind == "composite":  # parts are pinned to exact versions at registration
            config = pin_composite(config, make_resolver(session, tenant_id), name=body.name)
    except VerifierConfigError as exc:
        raise invalid(
            [
                FieldError(path=".".join(["$.config", *map(str, p)]), message=m)
                for p, m in exc.errors
            ]
        ) from exc
    if errors := judge_errors(session, settings, tenant_id, body.kind, config, "$.config"):
        raise invalid(errors)
    return config


VERIFIERS: Registry[VerifierVersion] = Registry(
    model=VerifierVersion,
    what="verifier",
    id_prefix="ver",
    check_quota=check_verifier_quota,
    check_config=_checked_config,
)


def make_resolver(session: Session, tenant_id: str) -> Resolver:
    """Look up a (name, version) of this tenant for composite verifiers."""

    def resolve(name: str, version: int | None) -> tuple[int, str, dict[str, Any]]:
        row = VERIFIERS.find(session, tenant_id, name, version)
        if row is None:
            raise LookupError(f"no verifier {name}" + (f" version {version}" if version else ""))
        return row.version, row.kind, row.config

    return resolve


def run_test(
    session: Session, row: VerifierVersion, body: VerifierTestRequest, settings: Settings
) -> VerifierTestResult:
    """Score samples through exactly the code path training uses. Everything the verifier
    needs is read first and the session's connection released before tenant code runs: a slow
    verifier must not hold one of the pool's connections for its whole run."""
    errors = [
        FieldError(path=f"$.samples[{i}].{field}", message=f"'{field}' is required")
        for i, sample in enumerate(body.samples)
        for field in ("prompt", "completion")
        if field not in sample
    ]
    if errors:
        raise invalid(errors)
    kind, config, name = row.kind, row.config, row.name
    resolve = preloaded_resolver(make_resolver(session, row.tenant_id), kind, config)
    session.close()  # back to the pool; the request's unit of work commits nothing after it
    started = time.perf_counter()
    try:
        # Opened and scored on this one thread: the sandbox dies with the thread that made it.
        judges = judge_context(settings, row.tenant_id)  # model judges call from this thread
        with open_verifier(
            kind, config, name=name, resolve=resolve, judges=judges
        ) as verifier:  # fmt: skip
            scores, errs = verifier.score(body.samples)
    except SandboxUnavailableError as exc:
        raise ProblemError(503, "Sandbox Unavailable", str(exc)) from exc
    elapsed_ms = (time.perf_counter() - started) * 1000
    return VerifierTestResult(scores=scores, errors=errs, elapsed_ms=round(elapsed_ms, 3))


def preloaded_resolver(resolve: Resolver, kind: str, config: dict[str, Any]) -> Resolver:
    """`resolve` answered ahead for every part a (pinned) composite opens, at any depth; the
    returned resolver reads no database."""
    table: dict[tuple[str, int | None], tuple[int, str, dict[str, Any]]] = {}
    pending = [config] if kind == "composite" else []
    while pending:
        for part in pending.pop().get("parts", []):
            key = (part["name"], part.get("version"))
            if key in table:
                continue
            try:
                table[key] = resolve(*key)
            except LookupError:
                continue  # opening reports it, with the part's path
            if table[key][1] == "composite":
                pending.append(table[key][2])

    def answer(name: str, version: int | None) -> tuple[int, str, dict[str, Any]]:
        if (name, version) not in table:
            raise LookupError(f"no verifier {name}" + (f" version {version}" if version else ""))
        return table[(name, version)]

    return answer
