"""The embedded broker hands a worker each message whole. kombu's own filesystem transport
creates a message's file before it serialises and writes the message, and a consumer reads
without the writer's lock: a worker polling then read an empty file, and the JSONDecodeError
stopped it, and `grpo-service up` with it (seen in the suite under load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Run in a fresh interpreter, as the API and the worker are: kombu keeps the filesystem
# transport's bindings in one state per process (`Transport.global_state`), so in the suite's
# process a "gpu" binding another test's app made to its own folder counts as made, none is
# written to this app's folder, and its messages are dropped as undeliverable.
EXCHANGE = """
import json, sys, threading, time
from pathlib import Path
from queue import Empty

from kombu.transport import filesystem
from kombu.utils import json as kombu_json

from service.core import filesystem_broker
from service.settings import Settings
from service.worker import make_celery


def slow_dumps(obj):
    time.sleep(0.3)  # a big message, or a loaded machine: the window the race needs
    return kombu_json.dumps(obj)


for module in (filesystem, filesystem_broker):  # kombu's writer, and ours
    module.dumps = slow_dumps
app = make_celery(Settings(data_dir=Path(sys.argv[1]), broker_url=None))
sent = [{"job": f"job_{i}"} for i in range(3)]
received, errors = [], []


def produce():
    try:
        with app.connection_for_write() as conn, conn.SimpleQueue("gpu") as queue:
            for body in sent:
                queue.put(body)
    except BaseException as exc:
        errors.append(repr(exc))


with app.connection_for_read() as conn, conn.SimpleQueue("gpu") as queue:
    producer = threading.Thread(target=produce)
    producer.start()
    deadline = time.monotonic() + 30
    while len(received) < len(sent) and time.monotonic() < deadline:
        try:
            message = queue.get(block=False)
        except Empty:
            time.sleep(0.005)  # a worker's poll, far inside the writer's 0.3 s
            continue
        received.append(message.payload)
        message.ack()
    producer.join()
print(json.dumps({"sent": sent, "received": received, "errors": errors}))
"""


def test_a_worker_never_reads_a_message_still_being_written(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", EXCHANGE, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr  # kombu's own transport: JSONDecodeError here
    result = json.loads(out.stdout.splitlines()[-1])
    assert not result["errors"], result["errors"]
    assert result["received"] == result["sent"]  # whole, and in the order sent
    assert "gpu.exchange" in {p.name for p in (tmp_path / "broker" / "control").iterdir()}
    assert not list((tmp_path / "broker" / "queue").iterdir())  # nothing left half-written


def test_two_broker_folders_in_one_process_each_get_their_messages(tmp_path: Path) -> None:
    """kombu keeps the filesystem transport's bindings in one state per process: the second
    folder's queue counted as bound, got no binding file, and its message was dropped."""
    from service.settings import Settings
    from service.worker import make_celery

    for name in ("first", "second"):
        app = make_celery(Settings(data_dir=tmp_path / name, broker_url=None))
        with app.connection_for_write() as conn, conn.SimpleQueue("gpu") as queue:
            queue.put({"broker": name})
        with app.connection_for_read() as conn, conn.SimpleQueue("gpu") as queue:
            assert queue.get(timeout=5).payload == {"broker": name}
