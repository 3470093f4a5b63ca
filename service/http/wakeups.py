"""Wake-ups sent off the request: a committed job's broker message, published by one thread of
the API process.

The message is only a wake-up (the row is the truth: `service.training.reconciler` enqueues a
queued job whose message never arrived), so a submission need not wait for the broker: its
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

from service.worker import enqueue_training

log = logging.getLogger(__name__)

Publish = Callable[[str, str, int], None]  # (job id, queue, devices)
_WakeUp = tuple[contextvars.Context, str, str, int]


class WakeUps:
    """A queue of wake-ups and the daemon thread that publishes them in order, started by the
    first one (so each process, uvicorn's workers included, starts its own)."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._pending: queue.SimpleQueue[_WakeUp | threading.Event] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, job_id: str, queue_name: str, devices: int = 1) -> None:
        # Published in the sender's context: with the settings (the broker) of its app.
        self._pending.put((contextvars.copy_context(), job_id, queue_name, devices))
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
            context, job_id, queue_name, devices = item
            try:
                context.run(self._publish, job_id, queue_name, devices)
            except Exception:
                log.warning(
                    "could not enqueue job %s; the reconciler will retry", job_id, exc_info=True
                )


wake_ups = WakeUps(enqueue_training)
