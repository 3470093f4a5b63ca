"""A production-mode cluster of our own for fault injection: a private Redis server, a fresh
PostgreSQL database (or a PostgreSQL server of its own), S3 on moto, one API and several
workers with short leases."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.e2e.services import TINY, RunningService, _spawn, _wait_ready, free_port, stop_all
from tests.redis_db import PrivateRedis

FAST_LEASES = {
    "GRPO_LEASE_SECONDS": "5",
    "GRPO_HEARTBEAT_SECONDS": "1",
    "GRPO_RECONCILE_SECONDS": "1",
    "GRPO_REQUEUE_AFTER_SECONDS": "3",
    "GRPO_MAX_ATTEMPTS": "5",
}


@dataclass
class PrivatePostgres:
    """A PostgreSQL server of its own (a fresh `initdb`, trust on 127.0.0.1), for a test that
    restarts its database server while the other tests go on using the shared one."""

    port: int
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="grpo-pg-")))

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the postgres user runs it
            shutil.chown(self.folder, "postgres")
        self._as_owner("initdb", "-D", str(self.folder / "data"), "-U", "postgres",
                       "--auth=trust", "--no-sync")  # fmt: skip
        self._pg_ctl("start")

    def restart(self) -> None:
        self._pg_ctl("restart", "-m", "fast")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        self._as_owner("pg_ctl", action, "-D", str(self.folder / "data"), "-w",
                       "-l", str(self.folder / "server.log"), "-o", options, *extra)  # fmt: skip

    def _as_owner(self, program: str, *args: str) -> None:
        # Debian keeps the server's programs off PATH, under its version's folder.
        debian = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"))
        found = shutil.which(program) or str(debian[-1])
        owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*owner, found, *args], check=True, capture_output=True, timeout=60)


@dataclass
class Cluster:
    svc: RunningService
    redis: PrivateRedis
    workers: list[subprocess.Popen[bytes]]

    def client(self, tenant: str) -> httpx.Client:
        return self.svc.client(self.svc.new_key(tenant))


@contextmanager
def run_cluster(
    work: Path,
    s3_endpoint: str,
    workers: int = 2,
    extra_env: dict[str, str] | None = None,
    model: Path | None = None,
    worker_queue: str = "gpu",
    worker_args: tuple[str, ...] = (),
    database_url: str | None = None,
) -> Iterator[Cluster]:
    """`database_url`: a database of the caller's (by default a fresh one on the shared server)."""
    from tests.e2e.conftest import PG, _psql

    work.mkdir(parents=True, exist_ok=True)
    db = f"grpo_chaos_{secrets.token_hex(4)}"
    if database_url is None:
        _psql(f"CREATE DATABASE {db}")
    redis = PrivateRedis(free_port())
    redis.start()
    port = free_port()
    env = {
        **__import__("os").environ,
        "GRPO_DATA_DIR": str(work / "data"),
        "GRPO_DATABASE_URL": database_url or f"{PG}/{db}",
        "GRPO_BROKER_URL": f"redis://127.0.0.1:{redis.port}/0",
        "GRPO_STORAGE_URL": f"s3://chaos-{secrets.token_hex(4)}",
        "GRPO_S3_ENDPOINT_URL": s3_endpoint,
        "GRPO_S3_REGION": "us-east-1",
        "GRPO_S3_ACCESS_KEY_ID": "testing",
        "GRPO_S3_SECRET_ACCESS_KEY": "testing",
        "GRPO_S3_CREATE_BUCKET": "true",
        **FAST_LEASES,
        **(extra_env or {}),
    }
    svc = RunningService(base_url=f"http://127.0.0.1:{port}", env=env, log_dir=work)
    svc.migrate()
    if model is not None:
        svc.add_model(TINY, model)
    svc.procs.append(_spawn(["api", "--port", str(port)], env, work / "api.log"))
    command = ["worker", "--queue", worker_queue, "--grace-seconds", "60", *worker_args]
    procs = [_spawn(command, env, work / f"worker{i}.log") for i in range(workers)]
    svc.procs += procs
    try:
        _wait_ready(svc)
        yield Cluster(svc=svc, redis=redis, workers=procs)
    finally:
        stop_all(svc.procs)
        redis.kill()
        if database_url is None:
            _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
