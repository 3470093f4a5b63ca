"""Verifier registry: immutable, numbered versions per (tenant, name)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.core.problems import FieldError, ProblemError, invalid, not_found
from service.core.quotas import check_verifier_quota
from service.judges.checks import judge_errors
from service.judges.endpoints import judge_context
from service.models import VerifierVersion
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


def config_sha256(kind: str, config: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": kind, "config": config}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def create_version(
    session: Session, tenant_id: str, body: VerifierCreate, settings: Settings
) -> VerifierVersion:
    check_verifier_quota(session, settings, tenant_id)
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
        raise invalid(errors)  # a judge's model or secret this tenant cannot use
    return append_version(session, VerifierVersion, "ver", tenant_id, body, config)


def append_version(
    session: Session, model: Any, id_prefix: str, tenant_id: str, body: Any, config: dict
) -> Any:
    """The name's next immutable version (1 for a new name) of a versioned object (a verifier,
    an environment): `body` carries name, kind and description; the sha256 is the config's."""
    latest = session.scalar(
        select(func.max(model.version)).where(model.tenant_id == tenant_id, model.name == body.name)
    )
    row = model(
        id=new_id(id_prefix),
        tenant_id=tenant_id,
        name=body.name,
        version=(latest or 0) + 1,
        kind=body.kind,
        description=body.description,
        config=config,
        sha256=config_sha256(body.kind, config),
    )
    session.add(row)
    session.flush()
    return row


def make_resolver(session: Session, tenant_id: str) -> Resolver:
    """Look up a (name, version) of this tenant for composite verifiers."""

    def resolve(name: str, version: int | None) -> tuple[int, str, dict[str, Any]]:
        row = find_version(session, tenant_id, name, version)
        if row is None:
            raise LookupError(f"no verifier {name}" + (f" version {version}" if version else ""))
        return row.version, row.kind, row.config

    return resolve


def version_lookup(model: Any, *columns: Any) -> tuple[Select[Any], Select[Any]]:
    """(latest version, exact version) of a tenant's named `model` row (a verifier or an
    environment version: both have tenant_id, name, version), with bound parameters."""
    of_name = select(*columns).where(
        model.tenant_id == bindparam("tenant"), model.name == bindparam("name")
    )
    latest = of_name.order_by(model.version.desc()).limit(1)
    return latest, of_name.where(model.version == bindparam("version"))


_ROW = version_lookup(VerifierVersion, VerifierVersion)


def version_params(tenant_id: str, name: str, version: int | None) -> dict[str, Any]:
    return {"tenant": tenant_id, "name": name, "version": version}


def find_version(
    session: Session, tenant_id: str, name: str, version: int | None = None
) -> VerifierVersion | None:
    stmt = _ROW[0] if version is None else _ROW[1]
    return session.scalar(stmt, version_params(tenant_id, name, version))


def get_version(
    session: Session, tenant_id: str, name: str, version: int | None = None
) -> VerifierVersion:
    row = find_version(session, tenant_id, name, version)
    if row is None:
        label = name if version is None else f"{name}@{version}"
        raise not_found("verifier", label)
    return row


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
