"""A tenant's Tinker checkpoints as stored objects: their room under the tenant's storage cap,
their expiry (the SDK's `ttl_seconds`), their deletion (the SDK's `delete_checkpoint`, an
overwrite, the expiry pass). docs/tinker.md#checkpoints-storage-ttl-and-deletion.

Order, as for a job's checkpoints: a new object is stored before a row names it, and an old one
is deleted only once the change of rows that drops it has committed. A crash in between leaves
an orphaned object, never a row without its object. No web framework here."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from service.core.db import after_commit, rows_matched, session_scope
from service.core.problems import ProblemError, too_large
from service.jobs.checkpoint_use import lineage_in_use
from service.models import TinkerCheckpoint, TinkerRun
from service.models.base import utcnow
from service.settings import Settings
from service.storage import ObjectStorage, open_storage_from_settings
from service.storage.archive import make_tar
from service.tinker.futures import new_checkpoint_id
from service.tinker.service import bad_request, missing, tinker_path
from workers.tinker.types import TinkerInputError

log = logging.getLogger("grpo.tinker")

MAX_TTL_S = 10 * 365 * 86400  # the SDK's documented ceiling: 10 years
CAP_SETTING = "GRPO_MAX_TINKER_BYTES_PER_TENANT"
EXPIRED_PER_PASS = 500  # one transaction's worth; the next pass takes the rest


# Expiry


def expiry(ttl_seconds: int | None) -> datetime | None:
    """When a checkpoint saved (or given a TTL) now expires; None: never."""
    if ttl_seconds is None:
        return None
    if not 1 <= ttl_seconds <= MAX_TTL_S:
        raise bad_request("ttl_seconds", f"seconds from 1 to {MAX_TTL_S} (10 years), or null")
    return utcnow() + timedelta(seconds=ttl_seconds)


def check_ttl(ttl_seconds: int | None) -> None:
    """Refuses a TTL out of range at submission (the worker computes the expiry on saving)."""
    expiry(ttl_seconds)


def set_ttl(session: Session, ckpt: TinkerCheckpoint, ttl_seconds: int | None) -> None:
    """The SDK's set_checkpoint_ttl: expire `ttl_seconds` from now, or never (None)."""
    ckpt.expires_at = expiry(ttl_seconds)
    session.flush()


# The tenant's storage cap


def stored_bytes(session: Session, tenant_id: str) -> int:
    """Bytes of the tenant's Tinker checkpoints kept in storage (expired ones until the pass
    deletes them)."""
    total = session.scalar(
        select(func.coalesce(func.sum(TinkerCheckpoint.size_bytes), 0)).where(
            TinkerCheckpoint.tenant_id == tenant_id
        )
    )
    return int(total or 0)


def _size_of(session: Session, run_id: str, kind: str, name: str | None = None) -> int:
    """The size of the run's checkpoint of that kind and name (None: its latest), 0 if none."""
    where = [TinkerCheckpoint.run_id == run_id, TinkerCheckpoint.kind == kind]
    if name is not None:
        where.append(TinkerCheckpoint.name == name)
    size = session.scalar(
        select(TinkerCheckpoint.size_bytes)
        .where(*where)
        .order_by(TinkerCheckpoint.created_at.desc())
        .limit(1)
    )
    return int(size or 0)


def over_cap(
    session: Session, settings: Settings, tenant_id: str, run_id: str, kind: str, name: str,
    size: int, estimated: bool = False,
) -> str | None:  # fmt: skip
    """Why a checkpoint of `size` bytes saved as (run, kind, name) would not fit under the
    tenant's cap (the checkpoint it overwrites is freed), or None when it fits."""
    cap = settings.max_tinker_bytes_per_tenant
    if not cap:
        return None
    kept = stored_bytes(session, tenant_id) - _size_of(session, run_id, kind, name)
    if kept + max(size, 1) <= cap:  # an estimate of 0 (a run's first save) needs room too
        return None
    path = tinker_path(run_id, kind, name)
    about = "about " if estimated else ""
    return (
        f"saving {path} ({about}{size} bytes) would bring your Tinker checkpoints to "
        f"{about}{kept + size} bytes, over the {cap} bytes a tenant may keep ({CAP_SETTING}): "
        "delete some (RestClient.delete_checkpoint) or give them a TTL"
    )


def refuse_over_cap(
    session: Session, settings: Settings, run: TinkerRun, kind: str, name: str
) -> None:
    """413 at submission for a save that would pass the tenant's cap, judged by the size of the
    run's last checkpoint of that kind (a run's checkpoints of one kind are alike in size); the
    worker checks the exact size again before it stores the new one."""
    estimate = _size_of(session, run.id, kind)
    reason = over_cap(session, settings, run.tenant_id, run.id, kind, name, estimate, True)
    if reason is not None:
        raise too_large(reason)


# Saving (the tinker worker)


def store(
    storage: ObjectStorage, settings: Settings, scratch: Path, run_id: str, tenant_id: str,
    kind: str, payload: dict[str, Any], write: Callable[[str, Path], None],
) -> TinkerCheckpoint:  # fmt: skip
    """`write` (the engine's save) to a tar in storage, its exact size within the tenant's cap
    (else a user error, nothing stored); the row to write with the request's outcome."""
    name = payload["name"]
    work = Path(tempfile.mkdtemp(prefix="save-", dir=scratch))
    try:
        write(run_id, work / "dir")
        archive, _, size = make_tar(work / "dir")
        with session_scope() as session:
            over = over_cap(session, settings, tenant_id, run_id, kind, name, size)
        if over is not None:
            raise TinkerInputError("path", over)
        ckpt_id = new_checkpoint_id()
        key = f"tinker/{tenant_id}/{ckpt_id}.tar"
        storage.put_file(key, archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return TinkerCheckpoint(id=ckpt_id, run_id=run_id, tenant_id=tenant_id, kind=kind,
                            name=name, object_key=key, size_bytes=size,
                            user_metadata=payload.get("user_metadata"),
                            expires_at=expiry(payload.get("ttl_seconds")))  # fmt: skip


def replace(session: Session, ckpt: TinkerCheckpoint) -> list[str]:
    """Adds a saved checkpoint's row in place of the run's one of that kind and name (an
    overwrite, or an expired one); the replaced objects' keys, to delete once committed."""
    replaced = session.scalars(
        delete(TinkerCheckpoint)
        .where(
            TinkerCheckpoint.run_id == ckpt.run_id,
            TinkerCheckpoint.kind == ckpt.kind,
            TinkerCheckpoint.name == ckpt.name,
        )
        .returning(TinkerCheckpoint.object_key)
    ).all()
    session.add(ckpt)
    return list(replaced)


# Deletion


def delete_objects(storage: ObjectStorage, keys: Iterable[str]) -> None:
    """After the rows are gone: a failure leaves an orphaned object, never a row without its
    object, so it is logged, not raised."""
    for key in keys:
        try:
            storage.delete(key)
        except Exception:
            log.warning("could not delete tinker checkpoint object %s", key, exc_info=True)


def _delete_row(session: Session, ckpt_id: str) -> bool:
    """A Core DELETE: of two deleters (the API, an expiry pass, an overwrite), one wins."""
    done = session.execute(
        delete(TinkerCheckpoint)
        .where(TinkerCheckpoint.id == ckpt_id)
        .execution_options(synchronize_session=False)
    )
    return rows_matched(done) == 1


def delete_checkpoint(session: Session, storage: ObjectStorage, ckpt: TinkerCheckpoint) -> None:
    """The SDK's delete_checkpoint: the row, then (once that has committed) its object. 409
    while a live job starts from it, as for a job's checkpoint."""
    path = tinker_path(ckpt.run_id, ckpt.kind, ckpt.name)
    if lineage_in_use(session, ckpt.tenant_id, ckpt.id):
        raise ProblemError(409, "Conflict", f"{path} is the base of a live job")
    if not _delete_row(session, ckpt.id):
        raise missing("checkpoint", path)  # a concurrent delete won
    session.flush()
    key = ckpt.object_key
    after_commit(session, lambda: delete_objects(storage, [key]))


def delete_expired(session: Session, now: datetime | None = None) -> list[str]:
    """One expiry pass: deletes the rows of checkpoints past their `expires_at` and returns their
    objects' keys, to delete once this has committed. One a live job starts from waits for a
    later pass (it answers as missing meanwhile)."""
    expired = session.scalars(
        select(TinkerCheckpoint)
        .where(TinkerCheckpoint.expires_at <= (now or utcnow()))
        .order_by(TinkerCheckpoint.expires_at)
        .limit(EXPIRED_PER_PASS)
    ).all()
    keys = []
    for ckpt in expired:
        if not lineage_in_use(session, ckpt.tenant_id, ckpt.id) and _delete_row(session, ckpt.id):
            keys.append(ckpt.object_key)
    session.flush()
    return keys


def expire_once(storage: ObjectStorage) -> int:
    """An expiry pass in its own transaction, then the objects; the number deleted."""
    with session_scope() as session:
        keys = delete_expired(session)
    delete_objects(storage, keys)
    if keys:
        log.info("deleted %d expired tinker checkpoint(s)", len(keys))
    return len(keys)


def expire_forever(settings: Settings, stop: threading.Event) -> None:
    """The expiry pass every `reconcile_seconds`, beside the reconciler (service.supervisor);
    errors are logged, never fatal."""
    storage = open_storage_from_settings(settings)
    while not stop.wait(settings.reconcile_seconds):
        try:
            expire_once(storage)
        except Exception:
            log.exception("tinker checkpoint expiry pass failed")
