"""A trainer frozen inside a transaction must not hold its job's row lock past its lease."""

from __future__ import annotations

import contextlib
import secrets
import time

import pytest
from sqlalchemy import text

from service.core.db import end_idle_transactions_after, make_engine

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def test_a_frozen_transaction_is_ended_and_its_row_lock_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = f"frozen_{secrets.token_hex(4)}"
    other = make_engine(PG)  # the reconciler: a session without the limit
    with other.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)"))
        c.execute(text(f"INSERT INTO {table} VALUES (1, 0)"))
    monkeypatch.setenv("PGOPTIONS", "")  # restored after the test
    end_idle_transactions_after(1.0)  # what every trainer process does at start
    trainer = make_engine(PG)
    try:
        with trainer.connect() as c:
            assert c.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "1s"
        frozen = trainer.connect()
        frozen.begin()
        frozen.execute(text(f"UPDATE {table} SET v = 1 WHERE id = 1"))  # row locked, then frozen
        started = time.monotonic()
        with other.begin() as c:
            c.execute(text("SET LOCAL lock_timeout = '20s'"))
            c.execute(text(f"UPDATE {table} SET v = 2 WHERE id = 1"))
        assert time.monotonic() - started < 10  # ~1 s: PostgreSQL ended the frozen session
        with other.connect() as c:
            assert c.execute(text(f"SELECT v FROM {table}")).scalar() == 2  # its write undone
        with contextlib.suppress(Exception):
            frozen.close()
    finally:
        with other.begin() as c:
            c.execute(text(f"DROP TABLE IF EXISTS {table}"))
        trainer.dispose()
        other.dispose()
