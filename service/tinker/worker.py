"""`grpo-service tinker-worker`: executes the queued Tinker requests (service/tinker/futures.py).

One process, one thread: it holds one `LoraHost` per catalog base model it was asked for
(workers/tinker/host.py: the base loaded once, each run its own adapter and optimiser state) and
runs one request at a time, in the order `futures.claim_next` gives (a tenant's requests oldest
first, tenants in turns weighted by their recent device-seconds). Checkpoints go to the
service's storage as one tar each; the rows that name them are written in the same transaction
that finishes the request.

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
import dataclasses
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from service.core import leases
from service.core.db import session_scope
from service.core.ids import new_id
from service.core.leases import LeaseLost
from service.models import CatalogModel, TinkerCheckpoint, TinkerRequest, TinkerRun, TinkerSession
from service.settings import Settings
from service.storage import ObjectStorage, open_storage_from_settings
from service.storage.archive import extract_tar
from service.tinker import checkpoints, futures
from service.tinker.service import tinker_path
from workers.tinker.types import Deadline, TimeLimitExceeded, TinkerInputError

if TYPE_CHECKING:
    from workers.tinker.host import LoraHost

log = logging.getLogger("grpo.tinker")


# Requests that change a run's state: once one is done, the run cannot be re-created empty.
STATEFUL = ("forward_backward", "optim_step", "load_weights")


class RunLost(RuntimeError):
    """The run's in-memory state is gone (its worker restarted, or lost a request's lease)."""


def _only(cls: type, values: dict[str, Any]) -> Any:
    """A dataclass of the engine's from a dict, keeping the fields it has."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _run_id(row: TinkerRequest) -> str:
    """The training run a request acts on (every kind but `sample` names one)."""
    if row.run_id is None:
        raise LookupError(f"this {row.kind} request names no training run")
    return row.run_id


class TinkerWorker:
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

    # The engine

    def _host(self, base_model: str) -> LoraHost:
        host = self.hosts.get(base_model)
        if host is None:
            loading = time.monotonic()
            import torch

            from service.training.weights import model_path
            from workers.tinker.host import LoraHost

            if self.device is None:
                self.device = "cuda" if torch.cuda.is_available() else "cpu"
            with session_scope() as session:
                model = session.get(CatalogModel, base_model)
                if model is None:
                    raise LookupError(f"model '{base_model}' left the catalog")
                weights = model_path(model, self.settings)
            state = self.root / "state" / base_model
            state.mkdir(parents=True, exist_ok=True)
            host = LoraHost(weights, device=self.device, state_dir=state,
                            max_resident_runs=self.settings.tinker_max_resident_runs)  # fmt: skip
            self.hosts[base_model] = host
            self.loading_s += time.monotonic() - loading
        return host

    def _run(self, row: TinkerRequest) -> LoraHost:
        """The run's host, the run created on it at its first request. A run this worker does
        not hold but that has trained (a worker restarted since) is not silently re-initialised:
        its request fails, and `load_state` from a checkpoint brings it back."""
        from workers.tinker.types import LoraConfig

        host, run_id = self._host(row.base_model), _run_id(row)
        if not host.has_run(run_id):
            with session_scope() as session:
                run = session.get(TinkerRun, run_id)
                config = dict(run.lora_config) if run else {}
                trained = session.scalar(
                    select(TinkerRequest.seq).where(
                        TinkerRequest.run_id == run_id,
                        TinkerRequest.status == "done",
                        TinkerRequest.kind.in_(STATEFUL),
                    )
                )
            if not config:
                raise LookupError(f"run {run_id} is gone")
            if trained is not None and row.kind != "load_weights":
                raise RunLost(
                    "this run's adapter and optimiser state were lost (its tinker worker "
                    "restarted, or lost the lease of one of its requests): load_state from one "
                    "of its checkpoints to go on"
                )
            host.create_run(run_id, _only(LoraConfig, config))
        return host

    def _forward(
        self, row: TinkerRequest, after: list[Any], backward: bool = False
    ) -> dict[str, Any]:
        from workers.tinker.types import Datum

        host = self._run(row)
        data = [_only(Datum, d) for d in row.payload["data"]]
        step = host.forward_backward if backward else host.forward
        p = row.payload
        deadline = Deadline.after(self.settings.tinker_request_timeout_s)  # the host is loaded
        out = step(_run_id(row), data, p["loss_fn"], p.get("loss_fn_config"), deadline)
        return dataclasses.asdict(out)

    def _forward_backward(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        return self._forward(row, after, backward=True)

    def _optim_step(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        from workers.tinker.types import AdamParams

        metrics = self._run(row).optim_step(_run_id(row), _only(AdamParams, row.payload["adam"]))
        return {"type": "optim_step", "metrics": metrics}

    def _sample(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        from workers.tinker.types import SamplingParams

        p = row.payload
        weights = self._unpacked(p["weights"]) if p.get("weights") else None
        result = self._host(row.base_model).sample(
            str(weights) if weights else None,
            p["prompt"],
            p["num_samples"],
            _only(SamplingParams, p["params"]),
            prompt_logprobs=p["prompt_logprobs"],
            deadline=Deadline.after(self.settings.tinker_request_timeout_s),
        )
        return dataclasses.asdict(result)

    def _save_weights(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        path = self._save(row, after, "training", self._run(row).save_state)
        return {"type": "save_weights", "path": path}

    def _save_for_sampler(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        path = self._save(row, after, "sampler", self._run(row).save_for_sampler)
        out: dict[str, Any] = {"type": "save_weights_for_sampler", "path": path}
        if row.payload.get("sampling_session"):
            sampler = TinkerSession(
                id=new_id("tks"),
                tenant_id=row.tenant_id,
                kind="sampler",
                base_model=row.base_model,
                model_path=path,
                session_id=row.payload.get("session_id"),  # its run's session
            )
            after.append(sampler)
            out["sampling_session_id"] = sampler.id
        return out

    def _load_weights(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        p, run_id = row.payload, _run_id(row)
        host = self._run(row)
        host.load_state(run_id, self._unpacked(p), with_optimizer=bool(p["optimizer"]))
        return {"type": "load_weights", "path": p["path"], "model_id": run_id}

    # Storage

    def _save(
        self, row: TinkerRequest, after: list[Any], kind: str, write: Callable[[str, Path], None]
    ) -> str:
        """The checkpoint stored (within the tenant's cap), its row written with the outcome."""
        if row.run_id is None:  # the API queues a save on its run
            raise LookupError("a save without its run")
        ckpt = checkpoints.store(self.storage, self.settings, self._scratch(), row.run_id,
                                 row.tenant_id, kind, row.payload, write)  # fmt: skip
        after.append(ckpt)
        return tinker_path(row.run_id, kind, ckpt.name)

    def _unpacked(self, ref: dict[str, Any]) -> Path:
        """A stored checkpoint unpacked on this machine (once: they never change)."""
        target = self.root / "checkpoints" / ref["checkpoint_id"]
        if not target.is_dir():
            work = Path(tempfile.mkdtemp(prefix="unpack-", dir=self._scratch()))
            try:
                self.storage.download_file(ref["object_key"], work / "ckpt.tar")
                extract_tar(work / "ckpt.tar", work / "dir")
                target.parent.mkdir(parents=True, exist_ok=True)
                (work / "dir").rename(target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return target

    def _scratch(self) -> Path:
        scratch = self.root / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch


# What the worker runs for each request kind (`futures.submit`'s): the handler gets the request
# and the list of rows to write with its outcome, and returns the future's result.
HANDLERS: dict[str, Callable[[TinkerWorker, TinkerRequest, list[Any]], dict[str, Any]]] = {
    "forward": TinkerWorker._forward,
    "forward_backward": TinkerWorker._forward_backward,
    "optim_step": TinkerWorker._optim_step,
    "sample": TinkerWorker._sample,
    "save_weights": TinkerWorker._save_weights,
    "save_for_sampler": TinkerWorker._save_for_sampler,
    "load_weights": TinkerWorker._load_weights,
}


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
