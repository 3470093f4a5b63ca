"""Which queues have a live worker: every `grpo-service worker` and `up` process writes one row
per queue it consumes (worker id, queue, host, pid, last seen, the devices it owns) and renews
it every `GRPO_HEARTBEAT_SECONDS`; a graceful stop deletes its rows, a killed worker's go stale.
The table is written by the worker's own process, not the training process, so a training step
that spins for minutes cannot make a worker look dead.

The API reads it at submission (`service.jobs.queue_checks`): a job asking for more devices
than any live worker of its queue owns is refused, and a job sent to a queue that no live
worker serves is accepted with a `no_worker` warning event.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from service.core.db import rows_matched, session_scope
from service.models import WorkerHeartbeat
from service.models.base import utcnow
from service.settings import Settings

log = logging.getLogger(__name__)

# A worker is live while its row was renewed within this many heartbeats: one missed beat
# (a slow database, a GC pause) is not a death.
LIVE_BEATS = 3
# Rows of workers that died without a goodbye are deleted after this long: long enough to tell
# an operator which worker went away, short enough that the table stays small.
FORGET_AFTER = timedelta(days=1)


def live_window(settings: Settings) -> timedelta:
    return timedelta(seconds=LIVE_BEATS * settings.heartbeat_seconds)


def beat(
    session: Session, worker_id: str, queues: Sequence[str], now: datetime, devices: int = 1
) -> None:
    """Renew this worker's rows, creating them on its first beat. Only this worker writes
    them, so update-then-insert cannot race with another writer."""
    for queue in queues:
        renewed = rows_matched(
            session.execute(
                update(WorkerHeartbeat)
                .where(WorkerHeartbeat.worker_id == worker_id, WorkerHeartbeat.queue == queue)
                .values(last_seen_at=now)
                .execution_options(synchronize_session=False)
            )
        )
        if not renewed:
            hostname, _, pid = worker_id.rpartition(":")
            session.add(
                WorkerHeartbeat(
                    worker_id=worker_id,
                    queue=queue,
                    hostname=hostname,
                    pid=int(pid) if pid.isdigit() else 0,
                    devices=devices,
                    started_at=now,
                    last_seen_at=now,
                )
            )
    session.execute(
        delete(WorkerHeartbeat)
        .where(WorkerHeartbeat.last_seen_at < now - FORGET_AFTER)
        .execution_options(synchronize_session=False)
    )


def forget(session: Session, worker_id: str) -> None:
    session.execute(
        delete(WorkerHeartbeat)
        .where(WorkerHeartbeat.worker_id == worker_id)
        .execution_options(synchronize_session=False)
    )


# Submissions read a queue's live workers through a memo of this process, at most this old
# (and never older than a heartbeat): the liveness it reports is LIVE_BEATS heartbeats wide
# already, and a burst of submissions then costs one read a second instead of one each. Only
# a served queue is remembered: a worker that has just started must silence the `no_worker`
# warning at once, and an unserved queue is the rare case that may pay a read each time.
LIVENESS_MEMO_S = 1.0
_capacity: dict[tuple[int, str], tuple[float, int]] = {}  # (engine id, queue) -> (when, devices)


def queue_capacity(session: Session, queue: str, settings: Settings) -> int | None:
    """The most devices a live worker of `queue` owns; None when no live worker serves it
    (`service.jobs.queue_checks.add_no_worker_event`)."""
    key, now = (id(session.get_bind()), queue), time.monotonic()
    memo = _capacity.get(key)
    if memo is not None and now - memo[0] < min(LIVENESS_MEMO_S, settings.heartbeat_seconds):
        return memo[1]
    since = utcnow() - live_window(settings)
    capacity = session.scalar(
        select(func.max(WorkerHeartbeat.devices)).where(
            WorkerHeartbeat.queue == queue, WorkerHeartbeat.last_seen_at >= since
        )
    )
    if capacity is None:
        _capacity.pop(key, None)
    else:
        _capacity[key] = (now, capacity)
    return capacity


def this_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@contextmanager
def registered(queues: Sequence[str], settings: Settings, devices: int = 1) -> Iterator[None]:
    """Keep this process's rows for `queues` (with the `devices` it owns) renewed while the
    block runs; delete them after. A database that is down only delays the beats: the worker
    itself runs on."""
    worker_id, stop = this_worker(), threading.Event()

    def run() -> None:
        while True:
            try:
                with session_scope() as session:
                    beat(session, worker_id, queues, utcnow(), devices)
            except Exception:
                log.warning("worker heartbeat failed; retrying", exc_info=True)
            if stop.wait(settings.heartbeat_seconds):
                return

    thread = threading.Thread(target=run, name="worker-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        try:
            with session_scope() as session:
                forget(session, worker_id)
        except Exception:  # its rows go stale instead
            log.warning("could not remove this worker's heartbeat rows", exc_info=True)
