from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.server import run_api, serve_in_process
from tests.e2e.conftest import PG, _psql
from tests.e2e.services import RunningService
from tests.redis_db import API, PrivateRedis


@pytest.fixture(scope="session")
def api(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    """The API alone on SQLite and local storage, with small limits, served in this process."""
    with serve_in_process({}, tmp_path_factory.mktemp("api-sqlite"), tiny_model_dir) as svc:
        yield svc


@pytest.fixture(scope="session")
def api_http(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RunningService]:
    """As `api`, as a real server process (uvicorn): for the official SDKs, a browser, and what
    only a server shows (streams, timeouts, connections)."""
    with run_api({}, tmp_path_factory.mktemp("api-http"), tiny_model_dir) as svc:
        yield svc


@pytest.fixture(scope="session")
def api_pg(
    tmp_path_factory: pytest.TempPathFactory,
    moto_server: str,
    tiny_model_dir: Path,
    redis_server: PrivateRedis,
) -> Iterator[RunningService]:
    """The API alone on PostgreSQL (a fresh database), Redis and S3 (moto), downloads
    answered with a presigned redirect, served in this process."""
    db = f"grpo_api_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {db}")
    env = {
        "GRPO_DATABASE_URL": f"{PG}/{db}",
        "GRPO_BROKER_URL": redis_server.fresh(API),
        "GRPO_STORAGE_URL": f"s3://grpo-api-{secrets.token_hex(4)}/objects",
        "GRPO_S3_ENDPOINT_URL": moto_server,
        "GRPO_S3_REGION": "us-east-1",
        "GRPO_S3_ACCESS_KEY_ID": "testing",
        "GRPO_S3_SECRET_ACCESS_KEY": "testing",
        "GRPO_S3_CREATE_BUCKET": "true",
        "GRPO_DOWNLOAD_REDIRECT": "true",
    }
    try:
        with serve_in_process(env, tmp_path_factory.mktemp("api-pg"), tiny_model_dir) as svc:
            yield svc
    finally:
        _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def served_over_http() -> Any:
    """The `api` fixture of a module whose tests need a server process (an official SDK, a
    browser, the CLI, connections): `api = served_over_http()` in it makes its `api` the
    shared server process, `api_http`."""

    @pytest.fixture(name="api", scope="module")
    def api_over_http(api_http: RunningService) -> RunningService:
        return api_http

    return api_over_http


@pytest.fixture(params=["sqlite", "postgresql"])
def any_api(request: pytest.FixtureRequest) -> RunningService:
    return request.getfixturevalue("api" if request.param == "sqlite" else "api_pg")


CHAT_MODEL = "tiny-chat"


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workers.grpo.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("chat"), chat_template=True)


@pytest.fixture
def chat_model(api: RunningService, chat_model_dir: Path) -> str:
    """The tiny model with a chat template, in the catalog of the test's `api`: OpenAI's
    fine-tuning files hold chat messages (tests/api/test_fine_tuning.py, test_tenancy.py)."""
    from service.catalog.service import find_model

    with api.session() as session:
        registered = find_model(session, CHAT_MODEL) is not None
    if not registered:
        api.add_model(CHAT_MODEL, chat_model_dir)
    return CHAT_MODEL


def tenant_client(svc: RunningService, name: str | None = None) -> httpx.Client:
    return svc.client(svc.new_key(name or f"t-{secrets.token_hex(4)}"))


@pytest.fixture
def client(api: RunningService) -> Iterator[httpx.Client]:
    with tenant_client(api) as c:
        yield c
