"""Tinker checkpoints as stored objects (issue 46 item 4), on SQLite and PostgreSQL, through the
tinker worker's own save path with a stand-in for the engine's writer: an overwrite frees the
old object once the new row has committed, and one whose outcome is not written keeps the old
checkpoint and leaves no new object behind; a save past the tenant's cap is refused before it
is stored; the expiry pass deletes what is past its TTL, rows and objects, and nothing else."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.core.ids import new_id
from service.models import TinkerCheckpoint, TinkerRequest, TinkerRun
from service.models.base import utcnow
from service.settings import Settings, settings_in_force
from service.storage import LocalStorage
from service.tinker import checkpoints, futures
from service.tinker.worker import TinkerWorker
from tests.service.tinker.test_lease import claim, lapse
from tests.service.tinker.test_queue import tenants

CAP = 50_000  # a tar is a whole number of 10 KiB records: 20 kB of weights take 30 KiB


class Writer:
    """What the engine's save_state does, as far as storage sees: a directory of `size` bytes."""

    def __init__(self, size: int) -> None:
        self.size = size

    def save_state(self, run_id: str, directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "adapter.bin").write_bytes(b"w" * self.size)


@pytest.fixture()
def worker(db_url: str, tmp_path: Path) -> Iterator[TinkerWorker]:
    settings = Settings(database_url=db_url, data_dir=tmp_path, max_tinker_bytes_per_tenant=CAP)
    with settings_in_force(settings):
        yield TinkerWorker(settings, "cpu")


def new_run(sessions: sessionmaker[Session], tenant_name: str) -> TinkerRun:
    with sessions.begin() as db:
        (tenant,) = tenants(db, tenant_name)
        run = TinkerRun(id=new_id("tkr"), tenant_id=tenant, base_model="tiny", lora_rank=2,
                        lora_config={"rank": 2})  # fmt: skip
        db.add(run)
    return run


def save(
    sessions: sessionmaker[Session], worker: TinkerWorker, run: TinkerRun, name: str, size: int,
    **payload: Any,
) -> TinkerRequest:  # fmt: skip
    """One save_weights request of `size` bytes through the worker; its row once done."""
    with sessions.begin() as db:
        attached = db.merge(run)
        futures.submit(db, run.tenant_id, "save_weights", "tiny", {"name": name, **payload},
                       attached)  # fmt: skip
    row = claim(sessions, worker.name)
    worker._run = lambda _row: Writer(size)  # type: ignore[method-assign]
    worker.execute(row)
    return outcome(sessions, row)


def outcome(sessions: sessionmaker[Session], row: TinkerRequest) -> TinkerRequest:
    with sessions() as db:
        found = db.get(TinkerRequest, row.seq)
        assert found is not None
        return found


def stored(sessions: sessionmaker[Session], run: TinkerRun) -> list[TinkerCheckpoint]:
    with sessions() as db:
        where = TinkerCheckpoint.run_id == run.id
        return list(db.scalars(select(TinkerCheckpoint).where(where)))


def objects(worker: TinkerWorker, run: TinkerRun) -> set[str]:
    """The keys of the tenant's objects in storage."""
    storage = worker.storage
    assert isinstance(storage, LocalStorage)
    root = storage.path_for(f"tinker/{run.tenant_id}")
    return {f"tinker/{run.tenant_id}/{p.name}" for p in root.iterdir()} if root.is_dir() else set()


def test_an_overwrite_frees_the_old_object_once_the_new_row_has_committed(
    sessions: sessionmaker[Session], worker: TinkerWorker
) -> None:
    run = new_run(sessions, "ckpt-overwrite")
    assert save(sessions, worker, run, "x", 1000).status == "done"
    (first,) = stored(sessions, run)
    assert save(sessions, worker, run, "x", 15_000).status == "done"
    (second,) = stored(sessions, run)
    assert second.id != first.id and second.size_bytes > first.size_bytes
    assert objects(worker, run) == {second.object_key}  # the first one's object is gone


def test_an_overwrite_that_is_not_written_keeps_the_old_checkpoint_and_no_new_object(
    sessions: sessionmaker[Session], worker: TinkerWorker
) -> None:
    run = new_run(sessions, "ckpt-unwritten")
    save(sessions, worker, run, "x", 1000)
    (first,) = stored(sessions, run)
    with sessions.begin() as db:
        futures.submit(db, run.tenant_id, "save_weights", "tiny", {"name": "x"}, db.merge(run))
    row = claim(sessions, worker.name)
    lapse(sessions, row)  # its worker lost the lease: the pass fails it, its outcome is fenced
    with sessions.begin() as db:
        futures.fail_lapsed(db)
    worker._run = lambda _row: Writer(2000)  # type: ignore[method-assign]
    worker.execute(row)
    assert [c.id for c in stored(sessions, run)] == [first.id]
    assert objects(worker, run) == {first.object_key}
    assert worker.storage.size(first.object_key) == first.size_bytes


def test_a_save_past_the_tenants_cap_is_refused_before_it_is_stored(
    sessions: sessionmaker[Session], worker: TinkerWorker
) -> None:
    run = new_run(sessions, "ckpt-cap")
    assert save(sessions, worker, run, "a", 20_000).status == "done"
    refused = save(sessions, worker, run, "b", 20_000)
    assert refused.status == "failed" and refused.error is not None
    assert refused.error["category"] == "user"
    assert "GRPO_MAX_TINKER_BYTES_PER_TENANT" in refused.error["error"]
    assert f"over the {CAP} bytes" in refused.error["error"]
    (kept,) = stored(sessions, run)
    assert kept.name == "a" and objects(worker, run) == {kept.object_key}
    # an overwrite frees what it replaces: the same size again fits
    assert save(sessions, worker, run, "a", 20_000, ttl_seconds=60).status == "done"
    (again,) = stored(sessions, run)
    assert again.expires_at is not None and objects(worker, run) == {again.object_key}


def test_the_expiry_pass_deletes_what_is_past_its_ttl_and_nothing_else(
    sessions: sessionmaker[Session], worker: TinkerWorker
) -> None:
    run = new_run(sessions, "ckpt-expiry")
    for name in ("old", "later", "forever"):
        save(sessions, worker, run, name, 100)
    with sessions.begin() as db:
        rows = {c.name: c for c in db.scalars(select(TinkerCheckpoint).where(
            TinkerCheckpoint.run_id == run.id))}  # fmt: skip
        rows["old"].expires_at = utcnow() - timedelta(seconds=1)
        rows["later"].expires_at = utcnow() + timedelta(hours=1)
    assert checkpoints.expire_once(worker.storage) == 1
    left = {c.name: c.object_key for c in stored(sessions, run)}
    assert set(left) == {"later", "forever"}
    assert objects(worker, run) == set(left.values())
    assert checkpoints.expire_once(worker.storage) == 0


def test_the_pass_beside_the_reconciler_deletes_expired_checkpoints(
    sessions: sessionmaker[Session], worker: TinkerWorker
) -> None:
    """`expire_forever`, the loop service.supervisor runs beside the reconciler."""
    run = new_run(sessions, "ckpt-expiry-loop")
    save(sessions, worker, run, "old", 100, ttl_seconds=1)
    (old,) = stored(sessions, run)
    with sessions.begin() as db:
        db.get(TinkerCheckpoint, old.id).expires_at = utcnow() - timedelta(seconds=1)
    stop = threading.Event()
    settings = worker.settings.model_copy(update={"reconcile_seconds": 0.05})
    loop = threading.Thread(target=contextvars.copy_context().run,
                            args=(checkpoints.expire_forever, settings, stop))  # fmt: skip
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while stored(sessions, run) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        loop.join(timeout=10)
    assert stored(sessions, run) == [] and objects(worker, run) == set()
