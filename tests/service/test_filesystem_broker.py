"""The embedded broker (service/core/filesystem_broker.py) hands a worker each message whole,
and keeps each broker folder's bindings to itself."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu.transport import filesystem
from kombu.utils import json

from service.core import filesystem_broker
from service.settings import Settings
from service.worker import make_celery


def test_a_worker_never_reads_a_message_still_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's own transport creates a message's file before it serialises and writes the
    message, and a consumer reads without the writer's lock: a worker polling then read an
    empty file, and the JSONDecodeError stopped it, and `grpo-service up` with it."""

    def slow_dumps(obj: Any) -> str:
        time.sleep(0.3)  # a big message, or a loaded machine: the window the race needs
        return json.dumps(obj)

    for module in (filesystem, filesystem_broker):  # kombu's writer, and ours
        monkeypatch.setattr(module, "dumps", slow_dumps)
    app = make_celery(Settings(data_dir=tmp_path, broker_url=None))
    sent = [{"job": f"job_{i}"} for i in range(3)]
    received: list[object] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with app.connection_for_write() as conn, conn.SimpleQueue("gpu") as queue:
                for body in sent:
                    queue.put(body)
        except BaseException as exc:  # noqa: BLE001 (reported by the assertion below)
            errors.append(exc)

    with app.connection_for_read() as conn, conn.SimpleQueue("gpu") as queue:
        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + 30
        while len(received) < len(sent) and time.monotonic() < deadline:
            try:
                message = queue.get(block=False)  # kombu's transport: JSONDecodeError here
            except Empty:
                time.sleep(0.005)  # a worker's poll, far inside the writer's 0.3 s
                continue
            received.append(message.payload)
            message.ack()
        producer.join()
    assert not errors, errors
    assert received == sent  # whole, and in the order sent
    assert not list((tmp_path / "broker" / "queue").iterdir())  # nothing left half-written


def test_two_broker_folders_in_one_process_each_get_their_messages(tmp_path: Path) -> None:
    """kombu keeps the filesystem transport's bindings in one state per process: the second
    folder's queue counted as bound, got no binding file, and its message was dropped."""
    for name in ("first", "second"):
        app = make_celery(Settings(data_dir=tmp_path / name, broker_url=None))
        with app.connection_for_write() as conn, conn.SimpleQueue("gpu") as queue:
            queue.put({"broker": name})
        with app.connection_for_read() as conn, conn.SimpleQueue("gpu") as queue:
            assert queue.get(timeout=5).payload == {"broker": name}


def test_a_wait_for_messages_ends_after_one_polling_interval(tmp_path: Path) -> None:
    """Celery's loop for this transport looks whether the worker should stop only between
    waits: a wait of its 2 s (here 10 s) kept an idle embedded worker from stopping."""
    app = make_celery(Settings(data_dir=tmp_path, broker_url=None))
    with app.connection_for_read() as conn, conn.SimpleQueue("gpu"):  # a consumer of "gpu"
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=10)
        assert time.monotonic() - started < 3  # the interval is 0.5 s
