"""The embedded mode's broker: kombu's filesystem transport, with each message written whole
before a consumer can see it.

kombu (5.7) writes a message file in place: it creates `<time>_<uuid>.<queue>.msg`, then
serialises and writes the payload. A consumer lists the folder, moves the file away and reads
it without the writer's lock, so a worker polling while the API writes can read an empty
file; the JSONDecodeError comes out of Celery's event loop as an unrecoverable error, the
worker stops, and `grpo-service up` stops with it (seen under load; upstream celery/kombu#1551).
Here the payload is written under a name no queue matches and renamed into place, which is
atomic within a folder: a consumer sees all of a message or nothing of it. Reading, ordering
(by the name's leading clock) and the folders are kombu's own.

kombu also keeps the transport's bindings in one state per process, whatever the folder: a
second broker folder used in the same process (a test beside an embedded service, a tool
that enqueues into two) found its queue "already bound", wrote no binding into its own
folder, and its messages were dropped as undeliverable. Here the state is one per folder.

A wait for messages returns after one polling interval (`Transport.drain_events`), so that a
worker stops as soon as it is asked.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any, ClassVar

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.json import dumps

# `make_celery` names this class for the embedded broker (kombu resolves "module:Class").
TRANSPORT = f"{__name__}:Transport"


class Channel(filesystem.Channel):
    # kombu's filesystem Channel names this `payload`, its base `message` (kombu passes it by
    # position): no name matches both
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # The name kombu gives a message, so that consumers find and order it as theirs.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.partial"  # ends in neither `.msg` nor any queue's suffix
        try:
            with open(partial, "wb") as fh:
                fh.write(dumps(payload).encode())
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
    _states: ClassVar[dict[str, virtual.BrokerState]] = {}

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        folder = os.path.abspath(client.transport_options.get("control_folder", "control"))
        self.state = self._states.setdefault(folder, virtual.BrokerState())

    def drain_events(
        self, connection: Any, timeout: float | None = None, **kwargs: Any
    ) -> None:  # kombu's base Transport takes **kwargs: passed on as they come
        """Wait for a message at most one polling interval (`socket.timeout` after it).

        Celery's loop for a transport without asynchronous I/O (this one) looks whether the
        worker should stop only between calls, and asks each to wait 2 s: an idle embedded
        worker took that long to begin stopping after SIGTERM. A caller with a longer timeout
        calls again, as Celery's loop does."""
        if timeout is not None:
            timeout = min(timeout, self.polling_interval)
        super().drain_events(connection, timeout, **kwargs)
