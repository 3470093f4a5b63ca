"""`grpo-service tinker-worker`: executes the queued Tinker requests (service/tinker/futures.py).

One process, one thread: it holds one `LoraHost` per catalog base model it was asked for
(workers/tinker/host.py: the base loaded once, each run its own adapter and optimiser state;
what each request kind does with it is `request_kinds.py`) and runs one request at a time, in
the order `futures.claim_next` gives (a tenant's requests oldest first, tenants in turns
weighted by their recent device-seconds). Checkpoints go to the service's storage as one tar
each; the rows that name them are written in the same transaction that finishes the request.

A forward, forward_backward or sample past GRPO_TINKER_REQUEST_TIMEOUT_S is stopped by the
engine at its next micro-batch or decoding step (workers.tinker.types.Deadline) and fails.

Each request is claimed under a lease (service/core/leases.py), renewed from a heartbeat thread
while it runs (a big forward_backward can outlast many leases) and fenced when its outcome is
written: a worker whose lease lapsed writes nothing, and forgets the run state the request
changed, which its future does not report. Between requests the worker also fails the requests
whose lease lapsed (a dead worker's, `futures.fail_lapsed`), as the reconciler does, and deletes
the checkpoints past their TTL (`checkpoints.expire_once`).

The API never imports this module (it loads torch, through workers.tinker, on the first request:
an idle worker started by `grpo-service up` costs no model memory).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from service.core import leases
from service.core.db import session_scope
from service.core.leases import LeaseLost
from service.models import TinkerCheckpoint, TinkerRequest
from service.settings import Settings
from service.storage import ObjectStorage, open_storage_from_settings
from service.tinker import checkpoints, futures
from service.tinker.request_kinds import HANDLERS, STATEFUL, RequestKinds, RunLost
from workers.tinker.types import TimeLimitExceeded, TinkerInputError

if TYPE_CHECKING:
    from workers.tinker.host import LoraHost

log = logging.getLogger("grpo.tinker")


class TinkerWorker(RequestKinds):
    """The request loop: claim, lease, run (`RequestKinds`), record."""

    def __init__(
        self, settings: Settings, device: str | None, storage: ObjectStorage | None = None
    ) -> None:
        self.settings, self.device = settings, device  # None: CUDA when present, at first use
        self.storage = storage or open_storage_from_settings(settings)
        # Who claimed a request, for the operator: recovery goes by the lease, not the name.
        self.name = f"tinker@{socket.gethostname()}:{os.getpid()}"
        self.root = settings.data_path / "tinker"
        self.hosts: dict[str, LoraHost] = {}  # base model name -> its host
        self.reaped_at = float("-inf")  # the last of `_passes` (monotonic)
        self.loading_s = 0.0  # of the request running: loading a base model, not its own work

    def run(self, stop: threading.Event) -> None:
        """Until `stop`. Nothing a request does ends the loop: a request's failure fails that
        request alone, and a database that cannot be reached is waited for."""
        pause = 0.0
        while not stop.is_set():
            self._passes()
            try:
                row = self._claim()
            except SQLAlchemyError:
                log.exception("tinker worker %s: cannot claim a request; trying again", self.name)
                row = None
            if row is None:
                pause = min(max(pause * 2, 0.01), self.settings.tinker_worker_poll_s)
                stop.wait(pause)
                continue
            pause = 0.0
            self.execute(row)

    def _claim(self) -> TinkerRequest | None:
        with session_scope() as session:
            if not futures.any_queued(session):
                return None
            row = futures.claim_next(session, self.name,
                                     lease_seconds=self.settings.lease_seconds,
                                     window_seconds=self.settings.tinker_fair_window_s)  # fmt: skip
            if row is not None:
                session.expunge(row)
        return row

    def _passes(self) -> None:
        """Every `reconcile_seconds`: fail the requests whose lease lapsed (a dead worker's),
        so a tinker worker alone, with no reconciler beside it, leaves no request running; and
        delete the checkpoints past their TTL, as the pass beside the reconciler does."""
        if time.monotonic() - self.reaped_at < self.settings.reconcile_seconds:
            return
        self.reaped_at = time.monotonic()
        try:
            with session_scope() as session:
                if count := futures.fail_lapsed(session):
                    log.warning("tinker worker %s: failed %d request(s) whose lease lapsed",
                                self.name, count)  # fmt: skip
            checkpoints.expire_once(self.storage)
        except SQLAlchemyError:
            log.exception("tinker worker %s: a periodic pass failed", self.name)

    def execute(self, row: TinkerRequest) -> None:
        """Runs the request and records its outcome; never raises. An outcome that cannot be
        stored (whatever the reason) fails the request with a server error instead; one whose
        lease was lost is not stored at all (the request was failed for it)."""
        started, self.loading_s = time.monotonic(), 0.0
        after: list[Any] = []  # rows to write with the outcome
        with self._renewing(row):
            result, error = self._outcome(row, after)
            # the tenant's device-seconds (usage, and its turns): a base model's load is not
            seconds = time.monotonic() - started - self.loading_s
            try:
                replaced = self._record(row, result, error, after, seconds)
            except LeaseLost:
                self._unstored(after)
                self._lost(row)
            except Exception as exc:  # the request fails; the worker keeps serving the others
                log.exception("tinker request %s (%s): its outcome was not stored", row.id,
                              row.kind)  # fmt: skip
                self._unstored(after)
                error = {"error": f"internal error storing the result ({type(exc).__name__})",
                         "category": "server"}  # fmt: skip
                try:
                    self._record(row, None, error, [], seconds)
                except LeaseLost:
                    self._lost(row)
                except Exception:  # the database is gone: the lease lapses (fail_lapsed)
                    log.exception("tinker request %s: its failure was not stored either", row.id)
            else:  # the new rows have committed: what they replaced goes
                checkpoints.delete_objects(self.storage, replaced)

    @contextmanager
    def _renewing(self, row: TinkerRequest) -> Iterator[None]:
        """Renews the request's lease every `heartbeat_seconds` from a thread while the body
        runs: the engine holds this thread for as long as a request takes. A renewal the
        database refuses is tried again at the next beat; a lost lease ends the renewals."""
        done = threading.Event()
        settings = self.settings

        def beat() -> None:
            while not done.wait(settings.heartbeat_seconds):
                try:
                    with session_scope() as session:
                        leases.renew(session, TinkerRequest, row.id, row.epoch,
                                     settings.lease_seconds, futures.RUNNING)  # fmt: skip
                except LeaseLost:
                    log.warning("tinker request %s: its lease was lost while it ran", row.id)
                    return
                except Exception:  # the lease may lapse: the outcome is then fenced off
                    log.exception("tinker request %s: its lease was not renewed", row.id)

        # in this thread's context: the same settings, so the same database (settings_in_force)
        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(beat,), name=f"lease-{row.id}",
                                  daemon=True)  # fmt: skip
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=settings.lease_seconds)

    def _lost(self, row: TinkerRequest) -> None:
        """The request's lease lapsed before its outcome was written: it was failed (LAPSED)
        and nothing of it is written. What it changed in the run's memory (gradients, a step,
        loaded weights) is not what its future reports, so the run is forgotten here: its next
        request fails as after a restart, until load_state brings it back."""
        log.warning("tinker request %s (%s): lease lost, its outcome is not written", row.id,
                    row.kind)  # fmt: skip
        host = self.hosts.get(row.base_model)
        if row.kind in STATEFUL and row.run_id and host is not None and host.has_run(row.run_id):
            host.delete_run(row.run_id)

    def _outcome(
        self, row: TinkerRequest, after: list[Any]
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:

        handler = HANDLERS.get(row.kind)
        if handler is None:  # an API newer than this worker: the request fails, not the worker
            log.error("tinker request %s: unknown kind %r", row.id, row.kind)
            return None, {"error": f"this worker cannot run a {row.kind!r} request (it runs "
                          f"{', '.join(sorted(HANDLERS))})", "category": "server"}  # fmt: skip
        try:
            result = handler(self, row, after)
        except TinkerInputError as exc:
            return None, {"error": f"{exc.field}: {exc.message}", "category": "user"}
        except TimeLimitExceeded as exc:  # the request's own size: the tenant's to change
            return None, {"error": f"{row.kind} {exc} (GRPO_TINKER_REQUEST_TIMEOUT_S; send "
                          "less a request)", "category": "user"}  # fmt: skip
        except RunLost as exc:
            return None, {"error": str(exc), "category": "server"}
        except Exception as exc:  # the worker keeps serving the other requests
            log.exception("tinker request %s (%s) failed", row.id, row.kind)
            return None, {"error": f"internal error ({type(exc).__name__})", "category": "server"}
        try:  # what the API answers and the database keeps is JSON: no NaN, no Infinity
            json.dumps(result, allow_nan=False)
        except ValueError as exc:  # a value the engine should have refused (workers.tinker.finite)
            log.error("tinker request %s (%s): its result is not JSON: %s", row.id, row.kind, exc)
            return None, {"error": "the result holds a value that is not finite (NaN or "
                          "Infinity)", "category": "server"}  # fmt: skip
        return result, None

    def _record(
        self,
        row: TinkerRequest,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
        after: list[Any],
        seconds: float,
    ) -> list[str]:
        """Writes the outcome and its rows in one transaction; returns the object keys of the
        checkpoints they replaced (an overwrite), to delete once it has committed."""
        replaced: list[str] = []
        with session_scope() as session:
            # first, so the row stays this claim's to the commit (LeaseLost: nothing written)
            leases.fence(session, TinkerRequest, row.id, row.epoch, futures.RUNNING)
            if error is None:
                for item in after:
                    if isinstance(item, TinkerCheckpoint):  # an overwrite: the new one replaces
                        replaced += checkpoints.replace(session, item)
                    else:
                        session.add(item)
                session.flush()
            futures.finish(session, row.seq, result=result, error=error, device_seconds=seconds,
                           epoch=row.epoch)  # fmt: skip
        return replaced

    def _unstored(self, after: list[Any]) -> None:
        """The objects stored for an outcome that was not written: no row will name them."""
        keys = [item.object_key for item in after if isinstance(item, TinkerCheckpoint)]
        checkpoints.delete_objects(self.storage, keys)


def run_worker(settings: Settings, device: str | None = None) -> None:
    """Until SIGTERM or SIGINT (the request it is running finishes first). What a worker was
    running when it died is failed once its lease lapses, whoever's pass sees it first.
    `device`: unset, GRPO_SERVE_DEVICE, else CUDA when present."""
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker = TinkerWorker(settings, device or settings.serve_device)
    log.info("tinker worker %s on %s", worker.name, worker.device or "cuda when present")
    worker.run(stop)
