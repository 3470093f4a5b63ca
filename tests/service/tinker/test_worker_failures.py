"""The tinker worker records every request's outcome, on SQLite and PostgreSQL, and never lets a
request's failure escape (issue 46, item 1): a result that holds NaN (PostgreSQL's json refuses
it) and rows that the database refuses each fail their own request, with a clear error, and the
next request is served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.models import TinkerCheckpoint, TinkerRequest
from service.settings import Settings, settings_in_force
from service.tinker import futures
from service.tinker.worker import HANDLERS, TinkerWorker
from tests.service.tinker.test_queue import tenants


@pytest.fixture()
def worker(db_url: str, tmp_path: Path) -> Iterator[TinkerWorker]:
    settings = Settings(database_url=db_url, data_dir=tmp_path)
    with settings_in_force(settings):
        yield TinkerWorker(settings, "cpu")


def claim(sessions: sessionmaker[Session], worker: TinkerWorker) -> TinkerRequest:
    with sessions.begin() as db:
        row = futures.claim_next(db, worker.name, lease_seconds=60, window_seconds=600)
        assert row is not None
        db.expunge(row)
    return row


def outcome(sessions: sessionmaker[Session], row: TinkerRequest) -> TinkerRequest:
    with sessions() as db:
        found = db.get(TinkerRequest, row.seq)
        assert found is not None
        return found


def test_a_result_with_nan_fails_its_request_alone(
    sessions: sessionmaker[Session], worker: TinkerWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessions.begin() as db:
        (tenant,) = tenants(db, "nan-tenant")
        for i in range(2):
            futures.submit(db, tenant, "optim_step", "tiny", {"i": i})
    results = iter([{"metrics": {"grad_norm": float("nan")}}, {"metrics": {"grad_norm": 1.0}}])
    monkeypatch.setitem(HANDLERS, "optim_step", lambda worker, row, after: next(results))
    first = claim(sessions, worker)
    worker.execute(first)  # does not raise
    failed = outcome(sessions, first)
    assert failed.status == "failed" and failed.error is not None
    assert "not finite" in failed.error["error"] and failed.error["category"] == "server"
    second = claim(sessions, worker)
    worker.execute(second)
    done = outcome(sessions, second)
    assert (done.status, done.result) == ("done", {"metrics": {"grad_norm": 1.0}})


def test_rows_the_database_refuses_fail_their_request_with_a_clear_error(
    sessions: sessionmaker[Session], worker: TinkerWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessions.begin() as db:
        (tenant,) = tenants(db, "refused-tenant")
        futures.submit(db, tenant, "save_weights", "tiny", {"name": "x"})

    def save_weights(_: TinkerWorker, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        # no name: a NOT NULL column, refused by either database when the outcome is written
        after.append(TinkerCheckpoint(id="tkc_refused", run_id=None, tenant_id=row.tenant_id,
                                      kind="training", name=None, object_key="k"))  # fmt: skip
        return {"type": "save_weights", "path": "tinker://run/weights/x"}

    monkeypatch.setitem(HANDLERS, "save_weights", save_weights)
    row = claim(sessions, worker)
    worker.execute(row)
    failed = outcome(sessions, row)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["error"].startswith("internal error storing the result (")
    with sessions() as db:
        assert db.get(TinkerCheckpoint, "tkc_refused") is None


@pytest.mark.parametrize("kind", ["teleport", "run"])  # `run`: the name of a worker method
def test_a_request_of_a_kind_the_worker_does_not_run_fails_alone(
    sessions: sessionmaker[Session],
    worker: TinkerWorker,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """A kind with no handler (an API newer than its worker) fails that request, naming the
    kind and those the worker runs; the worker calls nothing for it and serves the next."""
    with sessions.begin() as db:
        (tenant,) = tenants(db, f"kind-{kind}-tenant")
        futures.submit(db, tenant, kind, "tiny", {})
        futures.submit(db, tenant, "optim_step", "tiny", {})
    monkeypatch.setitem(HANDLERS, "optim_step", lambda worker, row, after: {"ok": 1})
    first = claim(sessions, worker)
    worker.execute(first)  # does not raise
    failed = outcome(sessions, first)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error == {
        "error": f"this worker cannot run a {kind!r} request (it runs forward, "
        "forward_backward, load_weights, optim_step, sample, save_for_sampler, save_weights)",
        "category": "server",
    }
    second = claim(sessions, worker)
    worker.execute(second)
    done = outcome(sessions, second)
    assert (done.status, done.result) == ("done", {"ok": 1})
