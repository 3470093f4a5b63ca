"""A Tinker request's device-seconds are its own work (issue 46 item 2): they count in the
tenant's usage and order the tenants' turns (futures.claim_next), so the base model's load,
which the worker does once for whichever request comes first, is not charged to that request.
A real tinker worker on the tiny model, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.catalog.inspect import inspect_model
from service.catalog.service import add_model
from service.settings import Settings, settings_in_force
from service.storage import open_storage_from_settings
from service.tinker import futures
from service.tinker.worker import TinkerWorker
from tests.service.tinker.test_queue import tenants
from tests.service.tinker.test_worker_failures import claim, outcome

LOAD_S = 1.0
SAMPLE = {"prompt": [5, 9, 13], "num_samples": 1, "prompt_logprobs": False, "weights": None,
          "params": {"max_tokens": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                     "stop": None, "seed": 1}}  # fmt: skip


@pytest.fixture()
def worker(
    db_url: str, sessions: sessionmaker[Session], tmp_path: Path, tiny_model_dir: Path
) -> Iterator[TinkerWorker]:
    """A worker whose catalog holds the tiny model (a name of this test's own)."""
    settings = Settings(database_url=db_url, data_dir=tmp_path)
    with settings_in_force(settings), sessions.begin() as db:
        facts = inspect_model(tiny_model_dir, "local")
        storage = open_storage_from_settings(settings)
        add_model(db, storage, f"tiny-{tmp_path.name[-12:]}", str(tiny_model_dir), facts)
    with settings_in_force(settings):
        yield TinkerWorker(settings, "cpu")


def test_loading_the_base_model_is_not_the_first_requests_device_time(
    sessions: sessionmaker[Session],
    worker: TinkerWorker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workers.tinker import host

    class BigModelHost(host.LoraHost):
        """The tiny model loads in a blink: a big one's weights take their time off the disk."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(LOAD_S)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(host, "LoraHost", BigModelHost)
    model = f"tiny-{tmp_path.name[-12:]}"
    with sessions.begin() as db:
        (tenant,) = tenants(db, f"load-{tmp_path.name[-12:]}")
        for _ in range(2):
            futures.submit(db, tenant, "sample", model, SAMPLE)
    walls, rows = [], []
    for _ in range(2):
        row = claim(sessions, worker)
        began = time.monotonic()
        worker.execute(row)
        walls.append(time.monotonic() - began)
        rows.append(outcome(sessions, row))
    first, second = rows
    assert (first.status, second.status) == ("done", "done"), (first.error, second.error)
    assert walls[0] > LOAD_S  # the first request waited for the load
    assert first.device_seconds < walls[0] - LOAD_S, (first.device_seconds, walls)
    assert first.device_seconds == pytest.approx(second.device_seconds, abs=LOAD_S / 2)
