from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.services import RunningService, run_service
from tests.redis_db import E2E, PrivateRedis

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc", sql], check=True
    )


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """A new PostgreSQL database's URL; the database is dropped afterwards."""
    db = f"{prefix}_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {db}")
    try:
        yield f"{PG}/{db}"
    finally:
        _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


@pytest.fixture(scope="session")
def embedded_service(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RunningService]:
    work = tmp_path_factory.mktemp("embedded")
    # with its Tinker worker: test_tinker_base_model trains through it
    with run_service({}, work, embedded=True, model=tiny_model_dir, tinker=True) as svc:
        yield svc


@pytest.fixture(scope="session")
def production_service(
    tmp_path_factory: pytest.TempPathFactory,
    moto_server: str,
    tiny_model_dir: Path,
    redis_server: PrivateRedis,
) -> Iterator[RunningService]:
    """PostgreSQL (a fresh database), Redis (an emptied database), S3 (moto over HTTP)."""
    db = f"grpo_test_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {db}")
    env = {
        "GRPO_DATABASE_URL": f"{PG}/{db}",
        "GRPO_BROKER_URL": redis_server.fresh(E2E),
        "GRPO_STORAGE_URL": f"s3://grpo-{secrets.token_hex(4)}/objects",
        "GRPO_S3_ENDPOINT_URL": moto_server,
        "GRPO_S3_REGION": "us-east-1",
        "GRPO_S3_ACCESS_KEY_ID": "testing",
        "GRPO_S3_SECRET_ACCESS_KEY": "testing",
        "GRPO_S3_CREATE_BUCKET": "true",
    }
    try:
        work = tmp_path_factory.mktemp("production")
        with run_service(env, work, embedded=False, model=tiny_model_dir) as svc:
            yield svc
    finally:
        _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
