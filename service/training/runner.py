"""Run one claimed attempt at a job: train through the engine, record every outcome.

The training process (`train_process.py`, started by the watchdog that claimed the job and
renews its lease) calls `run_claimed`; `run_job` claims and trains in the calling process, with
no watchdog and no lease renewal (tests, tools). Every write goes through the fenced transitions
of `lifecycle`, so a run that lost its claim can change nothing. The engine's hooks also send
progress beacons (`progress.py`) to the watchdog, which renews the lease only while they come.
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

from service.core.db import session_scope
from service.core.ids import new_id
from service.jobs import lifecycle, pausing, run_writes
from service.jobs.checkpoint_use import checkpoint_in_use
from service.judges.endpoints import judge_context
from service.models import Checkpoint, Job
from service.settings import Settings, get_settings
from service.storage import ObjectStorage, open_storage_from_settings
from service.storage.archive import make_tar
from service.training import resume
from service.training.child import DONE, LEFT_TO_RECONCILER
from service.training.environment import open_environment
from service.training.preflight_run import gate as preflight_gate
from service.training.progress import Beacon
from service.training.rollout_store import RolloutWriter
from service.training.scorers import open_scorers
from service.training.trackers import JobTrackers
from service.training.uploads import error_code, upload_verified
from service.training.usage import UsageMeter, record_step_usage
from service.training.weights import base_weights
from workers.observability import job_context, record_step

log = logging.getLogger(__name__)
TRACKER_SAMPLE_ROWS = 16  # completions per step in a tracker's sample table (one group at G=16)


class JobRun:
    """One claimed attempt at a job: holds the epoch and turns engine callbacks into writes.
    In a job's group of ranks (`ranks.py`) it is rank 0's: the other ranks write nothing."""

    lead = True  # writes the job's rows (a `ranks.Follower` does not)

    def __init__(
        self,
        job: Job,
        epoch: int,
        settings: Settings,
        storage: ObjectStorage,
        beacon: Beacon | None = None,
        release_requested: threading.Event | None = None,
    ) -> None:
        self.job_id, self.tenant_id, self.epoch = job.id, job.tenant_id, epoch
        self.total_steps = job.total_steps
        self.keep_checkpoints: int | None = job.spec.get("keep_checkpoints")
        self.settings, self.storage = settings, storage
        self.beacon = beacon or Beacon(None)
        self.step = 0  # the last step recorded (or resumed from)
        self._local_checkpoint: Path | None = None  # the newest local copy (the others go)
        self.lost = threading.Event()
        self.cancel_requested = threading.Event()
        self.pause_requested = threading.Event()  # `pausing`: checkpoint, stop, `paused`
        self._polled_at: int | None = None  # the step boundary whose status was read
        # SIGTERM: hand the job back (the training process may install its handler early)
        self.release_requested = release_requested or threading.Event()
        self.trackers: JobTrackers | None = None  # report_to: started once the attempt begins
        self.usage = UsageMeter()  # device time from the claim on (docs/usage.md)

    # -- engine hooks -------------------------------------------------------------------
    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self._fenced(record_step_usage, step, metrics, self.usage.take(metrics))
        self.step = step
        if self.trackers is not None:
            self.trackers.log_metrics(step, metrics)
        self.beacon.send("step", step=step)
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
        replaced = self._fenced(run_writes.record_checkpoint, row)
        self._delete_objects([replaced] if replaced else [])
        if self.keep_checkpoints is not None:
            pruned = self._fenced(
                run_writes.prune_checkpoints, self.keep_checkpoints, self.total_steps,
                checkpoint_in_use,
            )  # fmt: skip
            self._delete_objects(pruned)  # after the rows' delete has committed
        self._drop_local_copies(directory)
        if self.trackers is not None:
            self.trackers.checkpointed()  # the TensorBoard files up to this checkpoint
        self.beacon.send("checkpoint", step=step)

    def _delete_objects(self, keys: list[str]) -> None:
        """Delete archives no row points at any more. A failure only leaves an orphan object
        behind, never a row without its object, so it is logged and training goes on."""
        for key in keys:
            try:
                self.storage.delete(key)
            except Exception:
                log.warning("could not delete checkpoint object %s", key, exc_info=True)

    def _drop_local_copies(self, directory: Path) -> None:
        """Keep only the newest local checkpoint: the older ones are stored and committed, and a
        long job would otherwise fill the worker's disk with one model copy per checkpoint."""
        previous, self._local_checkpoint = self._local_checkpoint, directory
        if previous is not None and previous != directory:
            shutil.rmtree(previous, ignore_errors=True)

    def should_stop(self) -> bool:
        """Asked at every step boundary: also the watchdog's sign that a step begins."""
        self.beacon.send("step_begins", step=self.step + 1)
        if self.lost.is_set():
            return True
        return self.cancel_requested.is_set() or self._poll_status()

    def should_release(self) -> bool:
        """Checkpoint this step and stop: the worker shuts down (hand the job back), or the
        job is `pausing` (it becomes `paused`). Asked before `should_stop`, at each boundary."""
        self.beacon.send("step_begins", step=self.step + 1)
        if self.lost.is_set():
            return False
        if not self.release_requested.is_set():
            self._poll_status()
        return self.release_requested.is_set() or self.pause_requested.is_set()

    def on_event(self, type_: str, message: str, data: dict[str, Any]) -> None:
        with session_scope() as session:
            lifecycle.fence(session, self.job_id, self.epoch)
            lifecycle.add_event(session, self.job_id, type_, message, data)

    def on_rollouts(
        self, store: RolloutWriter | None, step: int, split: str, rows: list[dict]
    ) -> None:
        """A step's completions: stored (unless `rollouts: none`), and the first few sent to
        the trackers' sample tables."""
        if store is not None:
            store(step, split, rows)
        if self.trackers is not None:
            self.trackers.log_samples(step, split, rows[:TRACKER_SAMPLE_ROWS])

    def rollout_writer(self, policy: str, seed: int) -> RolloutWriter:
        """The `on_rollouts` hook: each step's completions stored, fenced by our epoch."""
        return RolloutWriter(
            self.job_id, self.tenant_id, self.epoch, policy, seed, self.storage, self.settings,
            self._fenced, self.on_event,
        )  # fmt: skip

    # -- fenced writes ------------------------------------------------------------------
    def _fenced(self, write: Any, *args: Any) -> Any:
        """A write conditioned on our epoch; a database blip is retried while the lease lasts.
        Returns what the write returned, once committed."""
        deadline = time.monotonic() + 0.8 * self.settings.lease_seconds
        delay = 0.25
        while True:
            try:
                with session_scope() as session:
                    result = write(session, self.job_id, self.epoch, *args)
                return result
            except lifecycle.LeaseLost:
                self.lost.set()
                raise
            except OperationalError:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("database unavailable for job %s; retrying", self.job_id)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _poll_status(self) -> bool:
        """Read the job's status once per step boundary (`cancelling`, `pausing` are asks from
        the API); returns whether a cancel was asked for."""
        if self._polled_at != self.step:
            self._polled_at = self.step
            with session_scope() as session:
                status = session.scalar(select(Job.status).where(Job.id == self.job_id))
            if status == "cancelling":
                self.cancel_requested.set()
            elif status == "pausing":
                self.pause_requested.set()
        return self.cancel_requested.is_set()

    def finish(self, status: str, error: dict[str, Any] | None = None) -> None:
        with session_scope() as session:
            lifecycle.finish(session, self.job_id, self.epoch, status, error)

    def release(self) -> None:
        """Stopped at a step boundary, its checkpoint committed: a pausing job is `paused`;
        a running one goes back to the queue for another worker; a pending cancel finishes."""
        with session_scope() as session:
            paused = pausing.pause_attempt(session, self.job_id, self.epoch, self.step)
            released = not paused and lifecycle.release(session, self.job_id, self.epoch)
            row = session.execute(
                select(Job.queue, Job.devices).where(Job.id == self.job_id)
            ).one_or_none()
        if released:
            # imported here: only a handed-back run needs the queue (Celery's import is a
            # tenth of a second that every other run would spend)
            from service.worker import enqueue_training

            enqueue_training(self.job_id, *(row or ("gpu", 1)))
        elif not paused and not self.lost.is_set():
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


def claim_job(job_id: str, settings: Settings) -> tuple[Job, int] | None:
    """Claim the job for this worker: the detached row and the new epoch, or None."""
    with session_scope() as session:
        worker = f"{socket.gethostname()}:{os.getpid()}"
        epoch = lifecycle.claim(session, job_id, settings.lease_seconds, worker)
        if epoch is None:
            log.info("job %s is not claimable (taken, finished or cancelled); dropping", job_id)
            return None
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
    return job, epoch


def run_job(job_id: str, settings: Settings | None = None) -> None:
    """Claim the job and train it in this process, with no watchdog and no lease renewal
    (tests, tools: a lease must outlast the run). Workers run jobs through `supervisor`."""
    settings = settings or get_settings()
    claimed = claim_job(job_id, settings)
    if claimed is not None:
        run_claimed(*claimed, settings)


def attempt_dir(settings: Settings, job_id: str, epoch: int) -> Path:
    """The attempt's local folder (downloads, checkpoints), removed when it ends."""
    return settings.data_path / "work" / job_id / f"e{epoch}"


def run_claimed(
    job: Job,
    epoch: int,
    settings: Settings,
    beacon: Beacon | None = None,
    release_requested: threading.Event | None = None,
    device: str | None = None,
) -> int:
    """Train one claimed attempt; returns DONE or LEFT_TO_RECONCILER. On `device` (default:
    the engine's choice); as rank 0 of a group of ranks (`ranks.py`) when a process group is
    initialised: then a rank that dies makes the others' collectives fail, and that failure
    is left to the group's launcher (an exit, not a recorded outcome: the job resumes)."""
    job_id = job.id
    job_context.set({"job_id": job_id, "epoch": epoch})
    log.info("training job %s (epoch %d)", job_id, epoch)
    storage = open_storage_from_settings(settings)
    run = JobRun(job, epoch, settings, storage, beacon, release_requested)
    group = job.trainer_ranks > 1
    work_dir = attempt_dir(settings, job_id, epoch)
    # In a group the ranks share the checkpoint folder (each writes its optimizer shards
    # there); downloads are each rank's own; the launcher removes the attempt's folder.
    own_dir = work_dir / "rank0" if group else work_dir
    try:
        run.trackers = JobTrackers.open(job, epoch, settings, storage, own_dir, run.on_event)
        with run.sigterm_releases():
            _train(run, job, storage, own_dir, work_dir / "train", device)
    except lifecycle.LeaseLost:
        log.warning("job %s epoch %s: lease lost, this run writes nothing more", job_id, epoch)
    except OperationalError:
        # The database went away for longer than a write can wait. That is no fault of the job:
        # stop here; the lease lapses and the reconciler resumes it from its last checkpoint.
        log.exception(
            "job %s epoch %s: database unavailable; leaving it to the reconciler", job_id, epoch
        )
        return LEFT_TO_RECONCILER
    except Exception as exc:  # every failure ends the job with its reason
        if group and _peer_lost(exc):
            raise  # another rank died: the launcher ends the attempt, the job resumes
        log.exception("job %s failed", job_id)
        run.finish("failed", {"code": error_code(exc), "message": str(exc)[:2000]})
    finally:
        if run.trackers is not None:
            run.trackers.close(job_id)  # after the outcome: the runs end with the job's status
        if not group:
            shutil.rmtree(work_dir, ignore_errors=True)
    return DONE


def _peer_lost(exc: BaseException) -> bool:
    from workers.grpo.launch import peer_lost

    return peer_lost(exc)


def _train(
    run: Any,
    job: Job,
    storage: ObjectStorage,
    work_dir: Path,
    train_dir: Path,
    device: str | None = None,
) -> None:
    """One attempt's training, for a `JobRun` (which records) or a `ranks.Follower` (another
    rank of the group: the same data, model and verifiers, no writes)."""
    from workers.grpo.config import TrainSpec
    from workers.grpo.trainer import TrainHooks, train

    spec = TrainSpec.model_validate(
        {k: job.spec[k] for k in TrainSpec.model_fields if k in job.spec}
    )
    latest = resume.start_checkpoint(job)
    if latest is not None and latest.step >= spec.grpo.steps:
        resume.finish_from_final(run, latest)
        return
    records = resume.records(storage, job.dataset_id)
    eval_records = resume.records(storage, job.eval_dataset_id) if job.eval_dataset_id else None
    resume_from = resume.resume_point(run, job, storage, work_dir, latest)
    weights = base_weights(job, storage, run.settings, work_dir)
    hooks = TrainHooks(
        on_step=run.on_step,
        on_checkpoint=run.on_checkpoint,
        should_stop=run.should_stop,
        should_release=run.should_release,
        on_event=run.on_event,
    )
    policy = job.spec.get("rollouts", "all")
    store = run.rollout_writer(policy, spec.grpo.seed) if policy != "none" and run.lead else None
    if store is not None or run.trackers is not None:
        hooks.on_rollouts = lambda step, split, rows: run.on_rollouts(store, step, split, rows)
    eval_refs = job.spec.get("eval_verifiers") or job.spec["verifiers"]
    judges = judge_context(run.settings, job.tenant_id)  # one judge cache for the attempt
    on_step = hooks.on_step

    def on_step_with_judges(step: int, metrics: dict[str, float]) -> None:
        metrics.update(judges.take_metrics())  # judge/<name>/calls, cache_hits, seconds...
        on_step(step, metrics)

    hooks.on_step = on_step_with_judges
    eval_used = eval_refs if eval_records else []
    with (
        open_scorers(job.tenant_id, job.spec["verifiers"], run.beacon, judges) as scorers,
        open_scorers(job.tenant_id, eval_used, run.beacon, judges) as eval_scorers,
        open_environment(job) as environment,  # None unless the job trains on episodes
    ):
        # `preflight: require`: refuse the job before its first step on a fatal warning
        if run.lead:
            preflight_gate(job, records, scorers, weights, run.settings, run.on_event)
        judges.take_metrics()  # the gate's judge calls are no step's
        result = train(
            spec, records, run.usage.metered(scorers), train_dir, hooks,
            resume_from=resume_from, device=device, rollout_devices=job.rollout_devices,
            eval_records=eval_records,
            eval_scorers=run.usage.metered(eval_scorers) or None,
            weights=weights, environment=environment,
        )  # fmt: skip
    if run.lost.is_set():
        return
    if not result.stopped:
        run.finish("succeeded")
    elif result.released:
        run.release()
    else:
        run.finish("cancelled")
