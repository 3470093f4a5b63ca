"""The API for the API tests, with no worker: served in this process (the rule tests: the app on
a real database and storage, called through httpx with Starlette's ASGI test transport) or as a
real process (uvicorn: the tests of what only a server shows, and the official SDKs); and
helpers that reach into its database and storage the way a worker would (to seed a checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
from anyio.from_thread import BlockingPortal
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.http.http_limits import uvicorn_options
from service.settings import Settings
from tests.e2e.services import IDLE_QUEUE, TINY, RunningService, _wait_ready, free_port

# Small limits, so that every limit can be crossed cheaply.
LIMITS = {
    "GRPO_MAX_REQUEST_BYTES": str(1 << 20),
    "GRPO_MAX_DATASET_RECORDS": "50",
    "GRPO_MAX_DATASET_LINE_BYTES": "2000",
    "GRPO_MAX_OPEN_JOBS_PER_TENANT": "3",
    "GRPO_OPEN_JOBS_RETRY_AFTER_S": "7",
    "GRPO_SSE_KEEPALIVE_S": "1",
    "GRPO_AUTH_CACHE_S": "0.5",
    # All tests share 127.0.0.1: the throttle is tested on an API of its own.
    "GRPO_AUTH_FAILURE_LIMIT": "1000",
    # No worker here: a pre-flight answers 202 at once, still queued.
    "GRPO_PREFLIGHT_WAIT_S": "0",
    "GRPO_EVAL_MAX_RECORDS": "10",
    # No tinker worker here: a pending request's retrieve_future answers try_again soon.
    "GRPO_TINKER_LONG_POLL_S": "0.2",
}
# The operator's /metrics token: the API tests scrape as the operator does.
METRICS_TOKEN = "metrics-token-for-tests"
LIMITS["GRPO_METRICS_TOKEN"] = METRICS_TOKEN
# A queue whose devices hold 64 MiB: any job's memory plan exceeds that.
SMALL_DEVICE_QUEUE = "small-device"
# A queue whose devices hold 320 MiB: a job of 4 x 8 rows, 64 new tokens on the tiny model is
# planned at ~0.40 GiB on one device, ~0.25 GiB per device on two (tests/api/test_models.py).
SHARDED_QUEUE = "sharded"
LIMITS["GRPO_QUEUES"] = json.dumps(
    {"gpu": {}, IDLE_QUEUE: {}, SMALL_DEVICE_QUEUE: {"device_memory_gib": 1 / 16},
     SHARDED_QUEUE: {"device_memory_gib": 5 / 16}}
)  # fmt: skip


def _env(env_extra: dict[str, str], work: Path) -> dict[str, str]:
    return {**os.environ, "GRPO_DATA_DIR": str(work / "data"), **LIMITS, **env_extra}


@dataclass
class InProcessService(RunningService):
    """The app served in this process; `client` calls it as an HTTP client would, without a
    socket. Its settings are its own (`create_app(settings)`), not this process's."""

    app: FastAPI | None = None
    portal: BlockingPortal | None = None

    def client(self, key: str | None) -> httpx.Client:
        assert self.app is not None and self.portal is not None, "not started"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return AppClient(self.app, self.portal, base_url=self.base_url, headers=headers)


class AppClient(TestClient):
    """A client of an app already started (its lifespan run, its event loop on `portal`), as
    one over HTTP behaves: no redirect followed, a server error answered, not raised."""

    def __init__(self, app: FastAPI, portal: BlockingPortal, **kwargs: Any) -> None:
        super().__init__(
            app,
            raise_server_exceptions=False,
            follow_redirects=False,
            client=("127.0.0.1", 50000),
            **kwargs,
        )
        self.portal = portal  # the requests run on the started app's event loop

    def __enter__(self) -> Self:  # the app is started once, by `serve_in_process`
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextmanager
def serve_in_process(
    env_extra: dict[str, str], work: Path, model: Path | None = None
) -> Iterator[InProcessService]:
    """The app in this process, on the database and storage its settings name; `model` as in
    `run_api`."""
    from service.app import create_app

    svc = InProcessService(base_url="http://api.test", env=_env(env_extra, work), log_dir=work)
    svc.migrate()
    if model is not None:
        svc.add_model(TINY, model)
    app = create_app(svc.settings())
    with TestClient(app, base_url=svc.base_url) as started:  # runs the app's lifespan
        svc.app, svc.portal = app, started.portal
        yield svc


@contextmanager
def run_api(
    env_extra: dict[str, str], work: Path, model: Path | None = None
) -> Iterator[RunningService]:
    """The API alone; `model`, when given, is in its catalog as `tiny` (tests.e2e.services.TINY)."""
    env = _env(env_extra, work)
    port = free_port()
    svc = RunningService(base_url=f"http://127.0.0.1:{port}", env=env, log_dir=work)
    svc.migrate()
    if model is not None:
        svc.add_model(TINY, model)
    cmd = [sys.executable, "-m", "uvicorn", "service.main:app", "--port", str(port)]
    cmd += uvicorn_options(svc.settings())  # the limits `grpo-service api` runs with
    with (work / "api.log").open("wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--no-access-log"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    svc.procs.append(proc)
    try:
        _wait_ready(svc)
        yield svc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def settings_of(svc: RunningService) -> Settings:
    """The Settings the service process runs with."""
    return svc.settings()
