"""Start the real service processes (API, worker) for end-to-end tests, and a client to them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy.orm import Session

from service.settings import Settings

CLI = [sys.executable, "-m", "service.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningService:
    base_url: str
    env: dict[str, str]
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker_metrics_port: int | None = None

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [*CLI, *args], env=self.env, check=True, capture_output=True, text=True, timeout=120
        )
        return out.stdout

    def settings(self) -> Settings:
        """The Settings the service's processes run with (from their GRPO_ environment; a
        JSON value such as GRPO_QUEUES parsed as pydantic-settings parses it)."""
        values: dict[str, object] = {
            k[5:].lower(): v for k, v in self.env.items() if k.startswith("GRPO_")
        }
        if "queues" in values:
            values["queues"] = json.loads(str(values["queues"]))
        return Settings.model_validate(values)

    # The operator's commands, run in this process by the functions the CLI calls: a command
    # is a fresh interpreter (~1.5 s of CPU; `models add` ~9 s, it imports transformers), and
    # the suite made hundreds. The commands themselves run in `run_service`, tests/deploy and
    # test_key_scopes.py.
    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work on the service's database: commit on success."""
        from service.core.db import make_engine

        engine = make_engine(self.settings().effective_database_url)
        try:
            with Session(engine) as session, session.begin():
                yield session
        finally:
            engine.dispose()  # no connection outlives the call (tests restart PostgreSQL)

    def migrate(self) -> None:
        """`grpo-service migrate`."""
        from service.core.migrate import upgrade

        upgrade(self.settings().effective_database_url)

    def add_model(self, name: str, path: Path) -> None:
        """Register a model in the service's catalog (`grpo-service models add NAME PATH`)."""
        from service.catalog.inspect import inspect_model
        from service.catalog.service import add_model
        from service.storage import open_storage_from_settings

        facts = inspect_model(path.expanduser().resolve(), "local")
        with self.session() as session:
            add_model(session, open_storage_from_settings(self.settings()), name, str(path), facts)

    def new_key(self, tenant: str) -> str:
        """A full-scope key (`grpo-service create-api-key --tenant TENANT`)."""
        from service.auth.service import new_api_key

        with self.session() as session:
            return new_api_key(session, tenant)[1]

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-6000:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen([*CLI, *args], env=env, stdout=fh, stderr=subprocess.STDOUT)


def _wait_ready(svc: RunningService, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for p in svc.procs:
            if p.poll() is not None:
                raise RuntimeError(f"service process exited {p.returncode}\n{svc.logs()}")
        try:
            r = httpx.get(f"{svc.base_url}/readyz", timeout=5)
            if r.status_code == 200:
                return
            last = r.text
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise RuntimeError(f"service not ready: {last}\n{svc.logs()}")


# The catalog name under which the service fixtures register the session's tiny model.
TINY = "tiny"
# A queue the services declare and no worker consumes: its jobs stay queued until cancelled.
IDLE_QUEUE = "nobody-listens"
QUEUES = json.dumps({"gpu": {}, IDLE_QUEUE: {}})


@contextmanager
def run_service(
    env_extra: dict[str, str],
    work: Path,
    *,
    embedded: bool,
    model: Path | None = None,
    serve: bool = False,
    tinker: bool = False,
) -> Iterator[RunningService]:
    """Embedded: `grpo-service up`, with its inference server only when `serve` and its Tinker
    worker only when `tinker` (each a process of its own that most tests never call).
    Production: `migrate`, then `api` and `worker` apart."""
    port = free_port()
    env = {**os.environ, "GRPO_DATA_DIR": str(work / "data"), "GRPO_QUEUES": QUEUES, **env_extra}
    env.pop("GRPO_ALLOW_UNSAFE_VERIFIERS", None)
    svc = RunningService(base_url=f"http://127.0.0.1:{port}", env=env, log_dir=work)
    if embedded:
        up = ["up", "--port", str(port), *([] if serve else ["--no-serve"]),
              *([] if tinker else ["--no-tinker"])]  # fmt: skip
        svc.procs.append(_spawn(up, env, work / "up.log"))
    else:
        svc.cli("migrate")
        svc.procs.append(_spawn(["api", "--port", str(port)], env, work / "api.log"))
        svc.worker_metrics_port = free_port()
        worker = ["worker", "--metrics-port", str(svc.worker_metrics_port)]
        svc.procs.append(_spawn(worker, env, work / "worker.log"))
    try:
        _wait_ready(svc)
        if model is not None and embedded:
            svc.add_model(TINY, model)
        elif model is not None:  # the operator's command itself, once per session
            svc.cli("models", "add", TINY, str(model))
        yield svc
    finally:
        stop_all(svc.procs)


def stop_all(procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """SIGTERM every process (workers hand their jobs back), then wait; kill stragglers."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
