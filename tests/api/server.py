"""A real API process (uvicorn, no worker) for the API tests, and helpers that reach into its
database and storage the way a worker would (to seed a checkpoint)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.settings import Settings
from tests.e2e.services import RunningService, _wait_ready, free_port

# Small limits, so that every limit can be crossed cheaply.
LIMITS = {
    "GRPO_MAX_REQUEST_BYTES": str(1 << 20),
    "GRPO_MAX_DATASET_RECORDS": "50",
    "GRPO_MAX_DATASET_LINE_BYTES": "2000",
    "GRPO_MAX_OPEN_JOBS_PER_TENANT": "3",
    "GRPO_OPEN_JOBS_RETRY_AFTER_S": "7",
    "GRPO_SSE_KEEPALIVE_S": "1",
    "GRPO_AUTH_CACHE_S": "0.5",
}
# Jobs go to a queue nobody consumes: they stay queued until cancelled.
IDLE_QUEUE = "nobody-listens"


@contextmanager
def run_api(env_extra: dict[str, str], work: Path) -> Iterator[RunningService]:
    env = {**os.environ, "GRPO_DATA_DIR": str(work / "data"), **LIMITS, **env_extra}
    port = free_port()
    svc = RunningService(base_url=f"http://127.0.0.1:{port}", env=env, log_dir=work)
    svc.cli("migrate")
    cmd = [sys.executable, "-m", "uvicorn", "service.main:app", "--port", str(port)]
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
    values = {k[5:].lower(): v for k, v in svc.env.items() if k.startswith("GRPO_")}
    return Settings.model_validate(values)
