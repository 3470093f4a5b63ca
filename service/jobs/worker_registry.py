"""Which queues have a live worker: every `grpo-service worker` and `up` process writes one row
per queue it consumes (worker id, queue, host, pid, last seen) and renews it every
`GRPO_HEARTBEAT_SECONDS`; a graceful stop deletes its rows, a killed worker's go stale.

The API reads it at submission: a job sent to a declared queue that no live worker serves
would wait forever without a word, so it gets a `no_worker` warning event (it is still
accepted: a worker may be on its way, as in an autoscaled pool). The table is written by the
worker's own process, not the training process, so a training step that spins for minutes
cannot make a worker look dead.

Each row also holds the devices the worker owns (`--devices N`): a job asking for more than
any live worker of its queue owns is refused at submission (`check_devices`, a 422 naming the
queue's capacity); a queue with no live worker at all accepts it, with the warning above.
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
from service.core.problems import FieldError
from service.jobs import lifecycle
from service.jobs.schemas import JobCreate
from service.models import Job, WorkerHeartbeat
from service.models.base import utcnow
from service.settings import Settings
from workers.grpo.world import WorldSizeError, check_world

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
    (`add_no_worker_event`)."""
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


def check_devices(session: Session, body: JobCreate, settings: Settings) -> list[FieldError]:
    """`resources.devices` the batch splits across, and no more than the queue's live workers
    own (a queue nobody serves yet accepts any: a worker may be on its way)."""
    devices, path = body.resources.devices, "$.resources.devices"
    rollout = body.resources.rollout_devices
    if rollout and not body.grpo.max_off_policy_steps:
        message = (
            "rollout devices generate rollouts ahead of training: set "
            "grpo.max_off_policy_steps to 1 or more, or rollout_devices to 0"
        )
        return [FieldError(path="$.resources.rollout_devices", message=message)]
    if rollout and devices != rollout + 1:
        message = (
            f"rollouts generated ahead train on one device: resources.devices must be "
            f"rollout_devices + 1 = {rollout + 1}, not {devices}"
        )
        return [FieldError(path=path, message=message)]
    try:
        check_world(body, devices - rollout, knob="resources.devices")
    except WorldSizeError as exc:
        return [FieldError(path=path, message=str(exc))]
    capacity = queue_capacity(session, body.queue, settings) if devices > 1 else None
    if capacity is None or devices <= capacity:
        return []
    message = (
        f"{devices} devices asked, but the live workers of queue '{body.queue}' own at most "
        f"{capacity} (grpo-service worker --devices N --queue {body.queue})"
    )
    return [FieldError(path=path, message=message)]


def add_no_worker_event(session: Session, job: Job) -> None:
    """The `no_worker` event of a job whose queue has no live worker."""
    message = (
        f"no live worker serves queue '{job.queue}': the job stays queued until a worker "
        f"for it starts (grpo-service worker --queue {job.queue})"
    )
    lifecycle.add_event(session, job.id, "no_worker", message, {"queue": job.queue})


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
