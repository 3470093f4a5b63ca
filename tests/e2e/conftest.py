from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import pytest
import redis

from tests.e2e.services import RunningService, run_service

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc", sql], check=True
    )


@pytest.fixture(scope="session")
def embedded_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with run_service({}, tmp_path_factory.mktemp("embedded"), embedded=True) as svc:
        yield svc


@pytest.fixture(scope="session")
def production_service(
    tmp_path_factory: pytest.TempPathFactory, moto_server: str
) -> Iterator[RunningService]:
    """PostgreSQL (a fresh database), Redis (a fresh db number), S3 (moto over HTTP)."""
    db = f"grpo_test_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {db}")
    redis_db = 7
    redis.Redis(host="127.0.0.1", port=6379, db=redis_db).flushdb()
    env = {
        "GRPO_DATABASE_URL": f"{PG}/{db}",
        "GRPO_BROKER_URL": f"redis://127.0.0.1:6379/{redis_db}",
        "GRPO_STORAGE_URL": f"s3://grpo-{secrets.token_hex(4)}/objects",
        "GRPO_S3_ENDPOINT_URL": moto_server,
        "GRPO_S3_REGION": "us-east-1",
        "GRPO_S3_ACCESS_KEY_ID": "testing",
        "GRPO_S3_SECRET_ACCESS_KEY": "testing",
        "GRPO_S3_CREATE_BUCKET": "true",
    }
    try:
        with run_service(env, tmp_path_factory.mktemp("production"), embedded=False) as svc:
            yield svc
    finally:
        _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
