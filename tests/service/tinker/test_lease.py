"""Tinker requests are leased as jobs are (issue 46 item 5), on SQLite and PostgreSQL: a claim
takes a lease, the worker renews it while the request runs, a request whose lease lapsed is
failed (never run again) by the reconciler's pass or by any tinker worker's, and a worker that
lost the lease writes nothing and forgets the run state the request touched."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.models import TinkerCheckpoint, TinkerRequest
from service.models.base import utcnow
from service.settings import Settings, settings_in_force
from service.tinker import futures
from service.tinker.worker import HANDLERS, TinkerWorker
from service.training import reconciler
from tests.service.tinker.test_queue import tenants


@pytest.fixture()
def settings(db_url: str, tmp_path: Path) -> Iterator[Settings]:
    # a short lease, renewed often: a request of 2 s outlives three leases
    settings = Settings(database_url=db_url, data_dir=tmp_path, lease_seconds=0.6,
                        heartbeat_seconds=0.1, reconcile_seconds=0.05)  # fmt: skip
    with settings_in_force(settings):
        yield settings


@pytest.fixture()
def worker(settings: Settings) -> TinkerWorker:
    return TinkerWorker(settings, "cpu")


def submit(sessions: sessionmaker[Session], tenant: str, kind: str = "optim_step") -> None:
    with sessions.begin() as db:
        (tenant_id,) = tenants(db, tenant)
        futures.submit(db, tenant_id, kind, "tiny", {"name": "x"}, None)


def claim(sessions: sessionmaker[Session], name: str, lease_s: float = 60) -> TinkerRequest:
    with sessions.begin() as db:
        row = futures.claim_next(db, name, lease_seconds=lease_s, window_seconds=600)
        assert row is not None
        db.expunge(row)
    return row


def lapse(sessions: sessionmaker[Session], row: TinkerRequest) -> None:
    """As if its worker had stopped renewing the lease a while ago."""
    with sessions.begin() as db:
        db.execute(
            update(TinkerRequest)
            .where(TinkerRequest.seq == row.seq)
            .values(lease_until=utcnow() - timedelta(seconds=1))
        )


def reload(sessions: sessionmaker[Session], row: TinkerRequest) -> TinkerRequest:
    with sessions() as db:
        found = db.get(TinkerRequest, row.seq)
        assert found is not None
        return found


def failed_for_the_lease(row: TinkerRequest) -> bool:
    return (
        row.status == "failed"
        and row.result is None
        and row.error is not None
        and "lease" in row.error["error"]
        and "not run again" in row.error["error"]
        and row.error["category"] == "server"
    )


def test_a_claim_takes_a_lease(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "lease-claim")
    before = utcnow()
    row = claim(sessions, "tinker@a", lease_s=60)
    assert row.status == "running" and row.epoch == 1 and row.worker == "tinker@a"
    assert row.lease_until is not None
    lease_until = row.lease_until.replace(tzinfo=before.tzinfo)  # SQLite keeps no zone
    assert before + timedelta(seconds=59) < lease_until < utcnow() + timedelta(seconds=61)


def test_a_lapsed_request_is_failed_naming_the_lease_and_never_run_again(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    submit(sessions, "lease-lapsed")
    submit(sessions, "lease-live")
    lapsed, live = claim(sessions, "tinker@gone"), claim(sessions, "tinker@here")
    lapse(sessions, lapsed)
    with sessions.begin() as db:
        assert futures.fail_lapsed(db) == 1
    assert failed_for_the_lease(reload(sessions, lapsed))
    assert reload(sessions, live).status == "running"  # a live lease is left alone
    with sessions.begin() as db:  # not queued again: no worker runs it a second time
        assert futures.claim_next(db, "tinker@new", lease_seconds=60, window_seconds=600) is None
        assert futures.fail_lapsed(db) == 0
        futures.finish(db, live.seq, result={"ok": True})


def test_the_reconciler_pass_fails_lapsed_requests(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    submit(sessions, "lease-reconciler")
    row = claim(sessions, "tinker@gone")
    lapse(sessions, row)
    reconciler.run_once(settings)
    assert failed_for_the_lease(reload(sessions, row))


def test_an_idle_tinker_worker_fails_what_a_dead_one_left(
    sessions: sessionmaker[Session], worker: TinkerWorker
) -> None:
    """A worker replaced under a new hostname: its successor's loop ends its request once the
    lease lapses (no reconciler needed)."""
    submit(sessions, "lease-successor")
    row = claim(sessions, "tinker@old-host", lease_s=0.2)
    stop = threading.Event()
    loop = threading.Thread(target=contextvars.copy_context().run, args=(worker.run, stop))
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while reload(sessions, row).status == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        loop.join()
    assert failed_for_the_lease(reload(sessions, row))


def test_a_long_request_keeps_its_lease_and_completes(
    sessions: sessionmaker[Session], worker: TinkerWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat renews the lease of a request that runs three leases long while a
    reconciler keeps looking for lapsed ones."""
    submit(sessions, "lease-long")
    monkeypatch.setitem(HANDLERS, "optim_step", lambda w, row, after: time.sleep(2) or {"ok": 1})
    row = claim(sessions, worker.name, lease_s=worker.settings.lease_seconds)
    stop = threading.Event()

    def reap() -> None:
        while not stop.wait(0.05):
            with sessions.begin() as db:
                futures.fail_lapsed(db)

    reaper = threading.Thread(target=reap)
    reaper.start()
    try:
        worker.execute(row)
    finally:
        stop.set()
        reaper.join()
    done = reload(sessions, row)
    assert (done.status, done.result, done.error) == ("done", {"ok": 1}, None)


class Host:
    """Stands for a LoraHost holding one run."""

    def __init__(self, run_id: str) -> None:
        self.runs = {run_id}

    def has_run(self, run_id: str) -> bool:
        return run_id in self.runs

    def delete_run(self, run_id: str) -> None:
        self.runs.remove(run_id)


@pytest.mark.parametrize("kind", ["save_weights", "optim_step"])
def test_a_worker_whose_lease_lapsed_writes_nothing_and_forgets_what_it_changed(
    sessions: sessionmaker[Session],
    worker: TinkerWorker,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """Fencing: the request was failed while the worker ran it (cut off from the database past
    its lease); neither its result nor its rows are written. A request that changed the run's
    state in memory (optim_step), which its future does not report, leaves the run forgotten
    (its next request says its state was lost); a save changed nothing and the run stays."""
    submit(sessions, f"lease-fenced-{kind}", kind=kind)
    row = claim(sessions, worker.name, lease_s=60)
    with sessions.begin() as db:
        db.execute(update(TinkerRequest).where(TinkerRequest.seq == row.seq).values(run_id="r1"))
    row.run_id = "r1"
    host = Host("r1")
    worker.hosts["tiny"] = host

    def executed(_: TinkerWorker, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        after.append(TinkerCheckpoint(id=f"tkc_{kind}", run_id=row.run_id, tenant_id=row.tenant_id,
                                      kind="training", name=kind, object_key="k"))  # fmt: skip
        lapse(sessions, row)  # meanwhile the reconciler fails it
        with sessions.begin() as db:
            assert futures.fail_lapsed(db) == 1
        return {"type": kind}

    monkeypatch.setitem(HANDLERS, kind, executed)
    worker.execute(row)  # does not raise
    assert failed_for_the_lease(reload(sessions, row))
    with sessions() as db:
        assert db.get(TinkerCheckpoint, f"tkc_{kind}") is None
    assert host.has_run("r1") == (kind == "save_weights")
