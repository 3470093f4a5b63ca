"""The registry of one kind of named, versioned resource.

Versions are immutable and numbered 1, 2, ... per (tenant, name); each carries the sha256 of
its canonical `{"kind", "config"}` JSON. A job names a resource and optionally a version and
is stored with the version it resolved to (the latest when unset) and that sha256: what it
ran traces to exact code even after the name gets new versions. Another tenant's resources
answer as if they did not exist.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.ids import new_id
from service.core.problems import FieldError, not_found
from service.core.suggest import MAX_NAMES, did_you_mean
from service.models import NamedVersion
from service.registry.schemas import VersionCreate
from service.settings import Settings

Row = TypeVar("Row", bound=NamedVersion)

# (session, tenant, body, settings) -> the config to store, or a 422 naming each bad field
ConfigCheck = Callable[[Session, str, Any, Settings], dict[str, Any]]
QuotaCheck = Callable[[Session, Settings, str], None]  # a 429 when the tenant keeps too many


def config_sha256(kind: str, config: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": kind, "config": config}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Registry(Generic[Row]):
    model: type[Row]
    what: str  # "verifier": names the resource in 404s and in a job's reference errors
    id_prefix: str
    check_quota: QuotaCheck
    check_config: ConfigCheck

    def create(
        self, session: Session, tenant_id: str, body: VersionCreate, settings: Settings
    ) -> Row:
        """The name's next version (1 for a new name), after the quota and the config check."""
        self.check_quota(session, settings, tenant_id)
        config = self.check_config(session, tenant_id, body, settings)
        model = self.model
        latest = session.scalar(
            select(func.max(model.version)).where(
                model.tenant_id == tenant_id, model.name == body.name
            )
        )
        row = model(
            id=new_id(self.id_prefix),
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

    def find(
        self, session: Session, tenant_id: str, name: str, version: int | None = None
    ) -> Row | None:
        """A tenant's version of `name`: the latest when `version` is None."""
        model = self.model
        stmt = select(model).where(model.tenant_id == tenant_id, model.name == name)
        if version is None:
            stmt = stmt.order_by(model.version.desc()).limit(1)
        else:
            stmt = stmt.where(model.version == version)
        return session.scalar(stmt)

    def get(self, session: Session, tenant_id: str, name: str, version: int | None = None) -> Row:
        """As `find`, a 404 when there is none."""
        row = self.find(session, tenant_id, name, version)
        if row is None:
            raise not_found(self.what, name if version is None else f"{name}@{version}")
        return row

    def pin(
        self, session: Session, tenant_id: str, name: str, version: int | None, path: str
    ) -> Row | FieldError:
        """The version a job's reference at `path` resolves to, or the error naming it."""
        row = self.find(session, tenant_id, name, version)
        if row is not None:
            return row
        label = name if version is None else f"{name} version {version}"
        hint = did_you_mean(name, self.names(session, tenant_id))
        return FieldError(path=path, message=f"no {self.what} {label}{hint}")

    def names(self, session: Session, tenant_id: str) -> list[str]:
        """The tenant's names (its own only: they are offered in "did you mean")."""
        model = self.model
        stmt = select(model.name).where(model.tenant_id == tenant_id).distinct()
        return list(session.scalars(stmt.limit(MAX_NAMES)))
