"""Run one job on this worker: claim it, train through the engine, record every outcome.

Called by the Celery task with nothing but the job id. Every write goes through the fenced
transitions of `lifecycle`, so a run that lost its claim can change nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from service.db import session_scope
from service.ids import new_id
from service.jobs import lifecycle
from service.jobs.archive import extract_tar, make_tar
from service.jobs.scorers import open_scorers, records_from_jsonl
from service.models import Checkpoint, Dataset, Job
from service.settings import Settings, get_settings
from service.storage import ObjectStorage, open_storage_from_settings
from service.worker import enqueue_training
from workers.observability import job_context, record_step

log = logging.getLogger(__name__)


class JobRun:
    """One claimed attempt at a job: holds the epoch and turns engine callbacks into writes."""

    def __init__(self, job: Job, epoch: int, settings: Settings, storage: ObjectStorage) -> None:
        self.job_id, self.tenant_id, self.epoch = job.id, job.tenant_id, epoch
        self.total_steps = job.total_steps
        self.settings, self.storage = settings, storage
        self.lost = threading.Event()
        self.cancel_requested = threading.Event()
        self.release_requested = threading.Event()  # SIGTERM: hand the job back
        self._stop_heartbeat = threading.Event()

    # -- engine hooks -------------------------------------------------------------------
    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self._fenced(lifecycle.record_step, step, metrics)
        record_step(metrics)
        log.info("step %d/%s reward_mean %.4f", step, self.total_steps, metrics["reward_mean"])

    def on_checkpoint(self, step: int, directory: Path) -> None:
        tar_path, sha256, size = make_tar(directory)
        key = f"tenants/{self.tenant_id}/jobs/{self.job_id}/e{self.epoch}/step-{step}.tar"
        try:
            upload_verified(self.storage, key, tar_path, size)  # before the row points at it
        finally:
            tar_path.unlink(missing_ok=True)
        fmt = "peft-adapter" if (directory / "adapter_config.json").exists() else "full"
        row = Checkpoint(
            id=new_id("ckpt"),
            job_id=self.job_id,
            step=step,
            epoch=self.epoch,
            object_key=key,
            size_bytes=size,
            sha256=sha256,
            format=fmt,
        )
        self._fenced(lifecycle.record_checkpoint, row)

    def should_stop(self) -> bool:
        if self.lost.is_set():
            return True
        return self.cancel_requested.is_set() or self._poll_cancel()

    def should_release(self) -> bool:
        return self.release_requested.is_set() and not self.lost.is_set()

    def on_event(self, type_: str, message: str, data: dict[str, Any]) -> None:
        with session_scope() as session:
            lifecycle.fence(session, self.job_id, self.epoch, self.settings.lease_seconds)
            lifecycle.add_event(session, self.job_id, type_, message, data)

    # -- lease upkeep -------------------------------------------------------------------
    def _fenced(self, write: Any, *args: Any) -> None:
        """A write conditioned on our epoch; a database blip is retried while the lease lasts."""
        deadline = time.monotonic() + 0.8 * self.settings.lease_seconds
        delay = 0.25
        while True:
            try:
                with session_scope() as session:
                    write(session, self.job_id, self.epoch, self.settings.lease_seconds, *args)
                return
            except lifecycle.LeaseLost:
                self.lost.set()
                raise
            except OperationalError:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("database unavailable for job %s; retrying", self.job_id)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _poll_cancel(self) -> bool:
        with session_scope() as session:
            status = session.scalar(select(Job.status).where(Job.id == self.job_id))
        if status == "cancelling":
            self.cancel_requested.set()
        return self.cancel_requested.is_set()

    def _heartbeat(self) -> None:
        renewed = time.monotonic()
        while not self._stop_heartbeat.wait(self.settings.heartbeat_seconds):
            try:
                with session_scope() as session:
                    status = lifecycle.renew(
                        session, self.job_id, self.epoch, self.settings.lease_seconds
                    )
                renewed = time.monotonic()
                if status == "cancelling":
                    self.cancel_requested.set()
            except lifecycle.LeaseLost:
                log.warning("job %s epoch %s lost its lease; stopping", self.job_id, self.epoch)
                self.lost.set()
                return
            except Exception:  # database unreachable: keep trying while the lease lasts
                log.exception("heartbeat for job %s failed", self.job_id)
                if time.monotonic() - renewed > 0.8 * self.settings.lease_seconds:
                    # Stop before the lease can be taken over: never two live runs at once.
                    log.error("job %s: lease about to expire unrenewed; stopping", self.job_id)
                    self.lost.set()
                    return

    def start_heartbeat(self) -> threading.Thread:
        thread = threading.Thread(target=self._heartbeat, name=f"lease-{self.job_id}", daemon=True)
        thread.start()
        return thread

    def stop_heartbeat(self) -> None:
        self._stop_heartbeat.set()

    def finish(self, status: str, error: dict[str, Any] | None = None) -> None:
        with session_scope() as session:
            lifecycle.finish(session, self.job_id, self.epoch, status, error)

    def release(self) -> None:
        """Give the job back to the queue for another worker, or finish a pending cancel."""
        with session_scope() as session:
            released = lifecycle.release(session, self.job_id, self.epoch)
            queue = session.scalar(select(Job.queue).where(Job.id == self.job_id))
        if released:
            enqueue_training(self.job_id, queue or "gpu")
        elif not self.lost.is_set():
            self.finish("cancelled")

    @contextmanager
    def sigterm_releases(self) -> Iterator[None]:
        """While training, SIGTERM means: stop at the next step boundary and hand back."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGTERM, lambda *_: self.release_requested.set())
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)


ERROR_CODES = {
    "ModelLoadError": "model_load_error",
    "VerifierBudgetExceeded": "verifier_budget_exceeded",
    "SandboxUnavailableError": "sandbox_unavailable",
    "LookupError": "missing_reference",
    "NonFiniteTraining": "non_finite_training",
}


def error_code(exc: BaseException) -> str:
    """A stable, documented code for the job's `error` (the message carries the detail)."""
    return ERROR_CODES.get(type(exc).__name__, "internal_error")


def upload_verified(
    storage: ObjectStorage, key: str, path: Path, size: int, attempts: int = 4
) -> None:
    """Upload with retries, then check the stored size: a job never points at a partial
    checkpoint. (boto3 also sends a checksum that S3 verifies on receipt.)"""
    for attempt in range(1, attempts + 1):
        try:
            storage.put_file(key, path)
            stored = storage.size(key)
            if stored != size:
                raise OSError(f"stored {stored} bytes of {size} for {key}")
            return
        except Exception:
            if attempt == attempts:
                raise
            log.warning("checkpoint upload %s failed (attempt %d); retrying", key, attempt)
            time.sleep(min(30.0, 0.5 * 2**attempt))


def run_job(job_id: str, settings: Settings | None = None) -> None:
    settings = settings or get_settings()
    with session_scope() as session:
        worker = f"{socket.gethostname()}:{os.getpid()}"
        epoch = lifecycle.claim(session, job_id, settings.lease_seconds, worker)
        if epoch is None:
            log.info("job %s is not claimable (taken, finished or cancelled); dropping", job_id)
            return
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
    job_context.set({"job_id": job_id, "epoch": epoch})
    log.info("claimed job %s (epoch %d)", job_id, epoch)
    storage = open_storage_from_settings(settings)
    run = JobRun(job, epoch, settings, storage)
    work_dir = settings.data_path / "work" / job_id / f"e{epoch}"
    run.start_heartbeat()
    try:
        with run.sigterm_releases():
            _train(run, job, storage, work_dir)
    except lifecycle.LeaseLost:
        log.warning("job %s epoch %s: lease lost, this run writes nothing more", job_id, epoch)
    except OperationalError:
        # The database went away for longer than a write can wait. That is no fault of the job:
        # stop here; the lease lapses and the reconciler resumes it from its last checkpoint.
        log.exception(
            "job %s epoch %s: database unavailable; leaving it to the reconciler", job_id, epoch
        )
    except Exception as exc:  # every failure ends the job with its reason
        log.exception("job %s failed", job_id)
        run.finish("failed", {"code": error_code(exc), "message": str(exc)[:2000]})
    finally:
        run.stop_heartbeat()
        shutil.rmtree(work_dir, ignore_errors=True)


def _train(run: JobRun, job: Job, storage: ObjectStorage, work_dir: Path) -> None:
    from workers.grpo.config import TrainSpec
    from workers.grpo.trainer import TrainHooks, train

    spec = TrainSpec.model_validate(
        {k: job.spec[k] for k in TrainSpec.model_fields if k in job.spec}
    )
    records = _records(storage, job.dataset_id)
    eval_records = _records(storage, job.eval_dataset_id) if job.eval_dataset_id else None
    resume_from = _resume_point(run, job, storage, work_dir)
    hooks = TrainHooks(
        on_step=run.on_step,
        on_checkpoint=run.on_checkpoint,
        should_stop=run.should_stop,
        should_release=run.should_release,
        on_event=run.on_event,
    )
    eval_refs = job.spec.get("eval_verifiers") or job.spec["verifiers"]
    with (
        open_scorers(job.tenant_id, job.spec["verifiers"]) as scorers,
        open_scorers(job.tenant_id, eval_refs if eval_records else []) as eval_scorers,
    ):
        result = train(
            spec, records, scorers, work_dir / "train", hooks,
            resume_from=resume_from, eval_records=eval_records, eval_scorers=eval_scorers or None,
        )  # fmt: skip
    if run.lost.is_set():
        return
    if not result.stopped:
        run.finish("succeeded")
    elif result.released:
        run.release()
    else:
        run.finish("cancelled")


def _records(storage: ObjectStorage, dataset_id: str) -> list[dict[str, Any]]:
    with session_scope() as session:
        dataset = session.get(Dataset, dataset_id)
        if dataset is None:
            raise LookupError(f"dataset {dataset_id} is gone")
        key = dataset.object_key
    return records_from_jsonl(storage.get_bytes(key))


def _resume_point(run: JobRun, job: Job, storage: ObjectStorage, work_dir: Path) -> Path | None:
    """The last committed checkpoint, unpacked, when an earlier attempt left one."""
    with session_scope() as session:
        latest = session.scalar(
            select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step.desc())
        )
        if latest is not None:
            session.expunge(latest)
    if latest is None:
        if job.step > 0:
            message = "no checkpoint yet: starting over"
            run.on_event("resumed", message, {"from_step": 0, "redo_steps": job.step})
        return None
    resume_from, archive = work_dir / "resume", work_dir / "resume.tar"
    work_dir.mkdir(parents=True, exist_ok=True)
    storage.download_file(latest.object_key, archive)
    extract_tar(archive, resume_from)
    redone = max(0, job.step - latest.step)
    message = f"resuming from the step-{latest.step} checkpoint ({redone} step(s) to redo)"
    run.on_event("resumed", message, {"from_step": latest.step, "redo_steps": redone})
    return resume_from
