"""Database fixtures: migrate a fresh SQLite file and a fresh PostgreSQL database to head."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.core.db import make_engine
from service.core.migrate import upgrade


def _psql(sql: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", sql], check=True)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'grpo.db'}"
        upgrade(url)
        yield url
        return
    name = f"grpo_unit_{secrets.token_hex(4)}"
    _psql(f"CREATE DATABASE {name}")
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    upgrade(url)
    try:
        yield url
    finally:
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture()
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    yield sessionmaker(engine, expire_on_commit=False)
    engine.dispose()


@pytest.fixture
def scoped(sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """The run supervisor's and the run kinds' units of work on the test's database."""
    from service.training import kinds, supervisor

    @contextmanager
    def scope() -> Iterator[Session]:
        with sessions.begin() as session:
            yield session

    monkeypatch.setattr(supervisor, "session_scope", scope)
    monkeypatch.setattr(kinds, "session_scope", scope)
