"""Wake-ups sent off the request: a committed row's broker message (a job's, an evaluation's,
a pre-flight's), published by one thread of the API process. The one way a run is enqueued.

The message is only a wake-up (the row is the truth: `service.training.reconciler` enqueues a
queued row whose message never arrived), so a submission need not wait for the broker: its
answer goes out as soon as the row is committed, a broker that is down or slow costs the
request nothing (before, each submission waited out the connect timeout), and the publishing,
which is Celery's message building and a Redis round trip, runs beside the requests rather
than inside each one. A message still waiting when the process ends is sent by the reconciler.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from functools import partial

from sqlalchemy.orm import Session

from service.core.db import after_commit
from service.worker import enqueue_evaluation, enqueue_preflight, enqueue_training

log = logging.getLogger(__name__)

Publish = Callable[[], None]  # sends one row's task (`service.worker.enqueue_*`)
_WakeUp = tuple[contextvars.Context, str, Publish]


class WakeUps:
    """A queue of wake-ups and the daemon thread that publishes them in order, started by the
    first one (so each process, uvicorn's workers included, starts its own)."""

    def __init__(self) -> None:
        self._pending: queue.SimpleQueue[_WakeUp | threading.Event] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, what: str, publish: Publish) -> None:
        """Publish `what` ("job job_…", for logs) with `publish`, off this thread; call it only
        once the row is committed (`after_commit`)."""
        # Published in the sender's context: with the settings (the broker) of its app.
        self._pending.put((contextvars.copy_context(), what, publish))
        self._ensure_thread()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every wake-up sent before this call is published (or failed); False when
        `timeout_s` ran out first."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._pending.put(done)
        return done.wait(timeout_s)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="wake-ups", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._pending.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            context, what, publish = item
            try:
                context.run(publish)
            except Exception:
                log.warning("could not enqueue %s; the reconciler will retry", what, exc_info=True)


wake_ups = WakeUps()


def wake_job_after_commit(session: Session, job_id: str, queue: str, devices: int = 1) -> None:
    publish = partial(enqueue_training, job_id, queue, devices)
    after_commit(session, lambda: wake_ups.send(f"job {job_id}", publish))


def wake_evaluation_after_commit(session: Session, evaluation_id: str, queue: str) -> None:
    publish = partial(enqueue_evaluation, evaluation_id, queue)
    after_commit(session, lambda: wake_ups.send(f"evaluation {evaluation_id}", publish))


def wake_preflight(preflight_id: str, queue: str) -> None:
    """A pre-flight's wake-up: its row is committed mid-request (the request then waits for
    its outcome), so it is sent at once, not at the request's end."""
    wake_ups.send(f"pre-flight {preflight_id}", partial(enqueue_preflight, preflight_id, queue))
