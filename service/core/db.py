"""Database engine and sessions. One engine per database in a process; the caller commits (the
API's session dependency, the worker's task wrapper), services only flush."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Result, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from service.settings import Settings, get_settings


def _pool(settings: Settings) -> dict[str, Any]:
    """Bounded pool waits on every database: a burst beyond the pool waits `db_pool_timeout_s`,
    then answers 503 with Retry-After (service.http.errors), never hangs and never 500s."""
    return {
        "pool_size": settings.db_pool_size,
        "max_overflow": settings.db_max_overflow,
        "pool_timeout": settings.db_pool_timeout_s,
    }


def make_engine(url: str) -> Engine:
    pool = _pool(get_settings())
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        else:
            pool = {}  # one connection per thread: SQLAlchemy's pool for :memory:
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 60}, **pool
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn, _record) -> None:
            # WAL lets the API read while the worker writes; busy_timeout makes writers queue.
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # Never hang forever on a database that is down: bounded connect and pool waits.
    return create_engine(
        url,
        pool_pre_ping=True,
        **pool,
        connect_args={"connect_timeout": 5} if url.startswith("postgresql") else {},
    )


def end_idle_transactions_after(seconds: float) -> None:
    """Have PostgreSQL end this process's later sessions that sit inside a transaction longer
    than `seconds` (libpq reads PGOPTIONS at connect time).

    For trainer processes, with their lease as the limit: a trainer frozen mid-transaction
    (SIGSTOP, a stalled VM) would otherwise hold its job's row lock for as long as it is frozen,
    and the reconciler, which moves the job on once the lease has expired, would wait on that
    lock. Not for the API, whose uploads may legitimately run inside a request's transaction.
    """
    option = f"-c idle_in_transaction_session_timeout={max(1, int(seconds * 1000))}"
    os.environ["PGOPTIONS"] = f"{os.environ.get('PGOPTIONS', '')} {option}".strip()


def get_engine() -> Engine:
    """The process's engine for the database of the settings in force."""
    return _engine(get_settings().effective_database_url)


def get_sessionmaker() -> sessionmaker[Session]:
    return _sessionmaker(get_engine())


# One engine per database URL rather than per process: a process may host apps of different
# settings (`service.settings.settings_in_force`).
_engines: dict[str, Engine] = {}


def _engine(url: str) -> Engine:
    engine = _engines.get(url)
    if engine is None:
        # Two threads may each make one: the first stored is used, the other never connected
        # and holds nothing. No lock, so a forked child never waits on one its parent held.
        engine = _engines.setdefault(url, make_engine(url))
    return engine


@lru_cache
def _sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def dispose_engine(url: str) -> None:
    """Close the connections of the engine of `url` and forget it (an app's shutdown)."""
    engine = _engines.pop(url, None)
    if engine is not None:
        _sessionmaker.cache_clear()
        engine.dispose()


@contextmanager
def session_scope() -> Iterator[Session]:
    """A unit of work outside a request: commit on success, roll back on error."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


_BEFORE_COMMIT = "before_commit"
_AFTER_COMMIT = "after_commit"
_AFTER_ROLLBACK = "after_rollback"


def before_commit(session: Session, check: Callable[[], None]) -> None:
    """Run `check` when the session's transaction commits, however it is committed, right
    before the COMMIT and in its thread: a check that takes a lock (`service.jobs.open_jobs`) holds
    it from there to the end of the transaction, and no longer. A check that raises stops the
    commit; the caller rolls back."""
    session.info.setdefault(_BEFORE_COMMIT, []).append(check)


@event.listens_for(Session, "before_commit")
def _run_commit_checks(session: Session) -> None:
    for check in session.info.pop(_BEFORE_COMMIT, []):
        check()


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` once the request's transaction has committed (e.g. enqueue a task)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


def after_rollback(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` if the request's transaction is rolled back (e.g. release a claim)."""
    session.info.setdefault(_AFTER_ROLLBACK, []).append(callback)


def end_unit_of_work(session: Session, failed: bool) -> None:
    """Commit (or, `failed`, roll back) and close, then run the callbacks of that outcome."""
    try:
        if failed:
            session.rollback()
            for callback in session.info.pop(_AFTER_ROLLBACK, []):
                callback()
            return
        try:
            session.commit()
        except BaseException:
            session.rollback()
            for callback in session.info.pop(_AFTER_ROLLBACK, []):
                callback()
            raise
        for callback in session.info.pop(_AFTER_COMMIT, []):
            callback()
    finally:
        session.close()


def rows_matched(result: Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched: its result is a cursor's, which counts them."""
    return cast("CursorResult[Any]", result).rowcount
