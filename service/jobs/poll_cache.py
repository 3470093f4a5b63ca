"""A per-process cache of status-poll answers (PostgreSQL only), kept true by PostgreSQL's
LISTEN/NOTIFY: a trigger on `jobs` (migration 0015) notifies the job's id on every UPDATE or
DELETE, from whichever process made it (a worker, the reconciler, another API process).

The rules that keep it from answering a stale status:
- only 200 answers are cached (a 404 is read each time: the job may be created next);
- an answer read while a notification (or an invalidation of this process's own) arrived is
  not stored: the generation counter, taken before the read and compared under the lock at the
  store; else an update committed during the read could leave an old answer for good;
- every entry expires after POLL_CACHE_TTL_S, a bound for anything missed (a dead network the
  listener's socket has not noticed yet);
- while the listener is not connected nothing is answered from the cache nor stored in it; it
  is cleared when the connection is lost and again once LISTEN is back (notifications sent in
  between were missed);
- this process's own writes to `jobs` clear the cache at their commit, synchronously (a
  Session `after_commit` hook): a client's cancel followed by its poll sees the new status.
An entry is keyed by the job's id and holds its tenant: another tenant's poll misses it and
reads the database, which answers 404 as for a missing id.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction

from service.models import Job

log = logging.getLogger(__name__)

CHANNEL = "grpo_job_changed"  # migrations/versions/2026_12_02_0015_job_change_notify.py
# Would be a setting (`poll_cache_s`, 0: off); settings are being split, hence a constant.
POLL_CACHE_TTL_S = 1.0
MAX_ENTRIES = 10_000  # past it the cache is emptied: memory stays bounded, at a miss each
RECONNECT_S = 1.0

_caches: weakref.WeakSet[PollCache] = weakref.WeakSet()  # this process's (one per event loop)


class PollCache:
    """Job id -> (expires at, tenant, answer body). Read on the event loop without the lock
    (a dict read is atomic); stores and invalidations, from any thread, take it."""

    def __init__(self, connect_args: tuple[list[Any], dict[str, Any]]) -> None:
        self._args, self._kwargs = connect_args
        self._entries: dict[str, tuple[float, str, bytes]] = {}
        self._lock = threading.Lock()
        self.generation = 0
        self.listening = False
        self._task: asyncio.Task[None] | None = None
        _caches.add(self)

    def start(self) -> None:
        """Start listening, on the running event loop (until it ends)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    def get(self, tenant: str, job_id: str) -> bytes | None:
        if not self.listening:
            return None
        hit = self._entries.get(job_id)
        if hit is None or hit[1] != tenant or hit[0] <= time.monotonic():
            return None
        return hit[2]

    def store(self, tenant: str, job_id: str, body: bytes, generation: int) -> None:
        """Keep a 200 answer read after `generation` was taken, unless anything was invalidated
        since (the read may predate that change) or the listener is down."""
        with self._lock:
            if not self.listening or generation != self.generation:
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[job_id] = (time.monotonic() + POLL_CACHE_TTL_S, tenant, body)

    def invalidate(self, job_id: str | None = None) -> None:
        """Forget one job's answer (None: every answer); reads in flight will not be stored."""
        with self._lock:
            self.generation += 1
            if job_id is None:
                self._entries.clear()
            else:
                self._entries.pop(job_id, None)

    async def _listen(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    *self._args, **self._kwargs, autocommit=True
                )
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.invalidate()  # anything notified before LISTEN was missed
                    self.listening = True
                    async for note in conn.notifies():
                        self.invalidate(note.payload)
            except (psycopg.Error, OSError) as exc:
                log.warning("status-poll cache off, its listener failed: %s", exc)
            finally:
                self.listening = False
                self.invalidate()
            await asyncio.sleep(RECONNECT_S)


def _invalidate_everywhere() -> None:
    for cache in list(_caches):
        cache.invalidate()


_WROTE_JOBS = "grpo_wrote_jobs"


@event.listens_for(Session, "after_flush")
def _note_job_rows(session: Session, _flush: UOWTransaction) -> None:
    if any(isinstance(obj, Job) for obj in (*session.dirty, *session.deleted)):
        session.info[_WROTE_JOBS] = True


@event.listens_for(Session, "do_orm_execute")
def _note_job_statements(state: ORMExecuteState) -> None:
    mapper = state.bind_mapper
    if (state.is_update or state.is_delete) and mapper is not None and mapper.class_ is Job:
        state.session.info[_WROTE_JOBS] = True


@event.listens_for(Session, "after_commit")
def _clear_after_own_writes(session: Session) -> None:
    """This process's writes to `jobs` clear its caches before the request answers: the
    notification would come, but after the client's next poll perhaps."""
    if session.info.pop(_WROTE_JOBS, False):
        _invalidate_everywhere()


@event.listens_for(Session, "after_soft_rollback")
def _forget_rolled_back(session: Session, _previous: Any) -> None:
    session.info.pop(_WROTE_JOBS, None)
