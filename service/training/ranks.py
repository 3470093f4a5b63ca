"""A job on N devices: the training process launches its N ranks and reads how they ended.

The training process (`train_process.py`, in the process group its watchdog made for it) runs
`run_group`: the engine's launcher (`workers.grpo.launch`, torch's elastic agent, no restarts)
starts N ranks as its children, in that same group, each dying with it. Every rank joins the
torch.distributed group and trains its share of each step (`workers.grpo.distributed`).
Rank 0 runs the attempt as one process does (`runner.run_claimed`): it writes every row,
fenced by the epoch, and its stop, release and pause decisions hold for all ranks (the engine
broadcasts them). The others (`Follower`) write nothing.

The lease, fencing, cancel and pause rules are the one-process ones, for the whole group:
- the watchdog renews the lease from rank 0's beacons (relayed from a FIFO: the ranks are
  forked from the launcher's forkserver and inherit no pipe of the training process) and
  kills the whole group (`process_group.kill_tree`) on a lost lease, an overrun step or an
  unheeded cancel;
- SIGTERM to the training process (the worker shutting down) goes on to every rank (the
  launcher's own handling); rank 0 checkpoints at the next step boundary and hands the job
  back, and the ranks have the queue's step budget to end before they are killed;
- a rank that dies (killed, crashed) makes the launcher stop the others: the training process
  records a `rank_failed` event and exits as a crash, so the watchdog ends the attempt and the
  job resumes from its last committed checkpoint. Rank 0 records a failure (`failed`) only for
  an error of its own, never for a collective whose peer is gone (`launch.peer_lost`);
- an error of another rank's own (its verifier's budget spent, a non-finite step, a bad
  record) is classified there as rank 0 classifies its own (`uploads.error_code`), sent through
  torch elastic's error file (`launch.record_error`), and the training process fails the job
  with it, fenced, as rank 0 would: no retry. Only a rank that died is a crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from service.core.db import end_idle_transactions_after, session_scope
from service.jobs import lifecycle
from service.models import Job
from service.process_group import die_with_parent
from service.settings import Settings, get_settings
from service.storage import open_storage_from_settings
from service.training.progress import Beacon
from service.training.runner import DONE, LEFT_TO_RECONCILER, _train, attempt_dir, run_claimed
from service.training.uploads import error_code
from service.training.usage import UsageMeter

log = logging.getLogger(__name__)
RANK_FAILED = 1  # a rank died or crashed: to the watchdog, a crash (the attempt ends)
_ACTIVE = ("running", "pausing", "cancelling")


class Follower:
    """A rank other than 0: trains its share of every step and records nothing."""

    lead = False

    def __init__(self, settings: Settings) -> None:
        self.settings, self.beacon, self.usage = settings, Beacon(None), UsageMeter()
        self.trackers = None
        self.lost = threading.Event()  # never set: rank 0 alone holds the lease's writes
        self.step = 0

    def on_event(self, *_: Any) -> None: ...
    def on_step(self, *_: Any) -> None: ...
    def on_checkpoint(self, *_: Any) -> None: ...
    def finish(self, *_: Any, **__: Any) -> None: ...
    def release(self) -> None: ...

    def should_stop(self) -> bool:
        return False  # rank 0 decides for every rank (`distributed.Ranks.agree`)

    def should_release(self) -> bool:
        return False


class BeaconRelay:
    """A FIFO rank 0 writes its beacons to, copied onto the watchdog's pipe by a thread here."""

    def __init__(self, beacon: Beacon, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path, self.beacon = directory / "progress.fifo", beacon
        os.mkfifo(self.path, 0o600)
        self._fd = os.open(self.path, os.O_RDWR)  # a writer of its own: never an end of file
        threading.Thread(target=self._copy, name="beacon-relay", daemon=True).start()

    def _copy(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except OSError:  # closed: the group has ended
                return
            if self.beacon.fd is not None and data:
                with contextlib.suppress(BlockingIOError, BrokenPipeError):
                    os.write(self.beacon.fd, data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def run_group(
    job: Job, epoch: int, settings: Settings, beacon: Beacon, release: threading.Event
) -> int:
    """Launch the job's ranks and wait for them; the training process's exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from workers.grpo.launch import launch

    work_dir = attempt_dir(settings, job.id, epoch)
    relay = BeaconRelay(beacon, work_dir)
    budget = int(settings.step_timeout_for(job.queue)) + 1
    logs = work_dir / "launch"  # the ranks' error files
    try:
        results = launch(
            job.devices, rank_main, job.id, epoch, str(relay.path), release.is_set(),
            shutdown_timeout=budget, log_dir=str(logs),
        )  # fmt: skip
        return int(results.get(0, DONE))
    except SignalException:  # SIGTERM: passed on; rank 0 handed the job back, or ran out of time
        return RANK_FAILED if _still_ours(job.id, epoch) else DONE
    except ChildFailedError as exc:
        from workers.grpo.launch import recorded_error

        if (error := recorded_error(logs)) is not None:  # a rank's own error: the job's
            try:
                _record_job_failure(job, epoch, *error)
            except OperationalError:  # the database away: the lease lapses, the job resumes
                log.exception("job %s: could not record its failure", job.id)
                return LEFT_TO_RECONCILER
            return DONE
        rank, failure = _culprit(exc.failures)
        if failure.exitcode == LEFT_TO_RECONCILER:
            return LEFT_TO_RECONCILER
        _record_rank_failure(job, epoch, rank, _why(failure))
        return RANK_FAILED
    finally:
        relay.close()
        shutil.rmtree(work_dir, ignore_errors=True)


def _culprit(failures: dict[int, Any]) -> tuple[int, Any]:
    """Of the failures the launcher saw, the rank that died (a signal: killed, OOM-killed)
    rather than a peer that failed on the collective it broke, whichever exited first."""
    killed = [rank for rank, failure in failures.items() if failure.exitcode < 0]
    rank = min(killed or failures)
    return rank, failures[rank]


def _why(failure: Any) -> str:
    """A failure's message: a rank's error file holds it as {"message": ..., ...}."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message")
    return str(message or f"exit {failure.exitcode}")


def rank_main(job_id: str, epoch: int, fifo: str, release_early: bool) -> int:
    """One rank, forked from the launcher's forkserver (`workers.grpo.launch`)."""
    release = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: release.set())  # hand back at the next boundary
    if release_early:  # SIGTERM reached the training process before the ranks started
        release.set()
    # Never outlive the launcher (nor the lease it serves): the parent is its forkserver,
    # which exits as soon as the launcher is gone.
    die_with_parent(signal.SIGKILL)
    import torch.distributed as dist

    from workers.grpo.launch import join, leave
    from workers.observability import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    device = join(None)  # gloo on CPU, NCCL on CUDA (cuda:LOCAL_RANK)
    try:
        settings = get_settings()
        end_idle_transactions_after(settings.lease_seconds)
        with session_scope() as session:
            job = session.get(Job, job_id)
            if job is None or job.epoch != epoch:
                return DONE  # taken over before we started: nothing of it is ours
            session.expunge(job)
        if dist.get_rank() == 0:
            beacon = Beacon(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            code = run_claimed(job, epoch, settings, beacon, release, device=device)
            if code != DONE:
                raise SystemExit(code)  # the launcher reports it as this rank's exit status
            return code
        _follow_classified(job, epoch, settings, device)
        return DONE
    finally:
        leave()


def _follow_classified(job: Job, epoch: int, settings: Settings, device: str) -> None:
    """A rank > 0's share of the attempt; its own error classified as `run_claimed` classifies
    rank 0's, and handed to the launcher (the training process fails the job with it)."""
    from workers.grpo.launch import peer_lost, record_error

    try:
        _follow(job, epoch, settings, device)
    except OperationalError:  # the database away: no fault of the job (lease, reconciler)
        log.exception("job %s epoch %s: database unavailable on this rank", job.id, epoch)
        raise SystemExit(LEFT_TO_RECONCILER) from None
    except Exception as exc:
        if peer_lost(exc):
            raise  # another rank died: the launcher ends the attempt, the job resumes
        log.exception("job %s epoch %s: this rank failed", job.id, epoch)
        kind = {"code": error_code(exc), "message": str(exc)[:2000]}
        if not record_error(exc, kind):
            raise
        raise SystemExit(RANK_FAILED) from None  # the error file, as written, says the rest


def _follow(job: Job, epoch: int, settings: Settings, device: str) -> None:
    import torch.distributed as dist

    work_dir = attempt_dir(settings, job.id, epoch)
    own_dir = work_dir / f"rank{dist.get_rank()}"
    storage = open_storage_from_settings(settings)
    _train(Follower(settings), job, storage, own_dir, work_dir / "train", device)


def _still_ours(job_id: str, epoch: int) -> bool:
    with session_scope() as session:
        row = session.execute(select(Job.status, Job.epoch).where(Job.id == job_id)).one_or_none()
    return row is not None and row.epoch == epoch and row.status in _ACTIVE


def _record_job_failure(job: Job, epoch: int, rank: int, error: dict[str, Any]) -> None:
    """The job `failed` with a rank's classified error, fenced (as rank 0 records its own)."""
    code, message = str(error.get("code", "internal_error")), str(error.get("message", ""))
    failure = {"code": code, "message": f"rank {rank} of {job.devices}: {message}"[:2000]}
    log.error("job %s epoch %s failed on rank %s: %s", job.id, epoch, rank, message)
    with session_scope() as session:  # zero rows: the run lost its claim, or already ended
        lifecycle.finish(session, job.id, epoch, "failed", failure)


def _record_rank_failure(job: Job, epoch: int, rank: int, why: str) -> None:
    """A `rank_failed` event, fenced (a run that lost its claim says nothing); best effort."""
    message = (
        f"rank {rank} of {job.devices} stopped ({why[:300]}); the group was stopped and the "
        "attempt ends (the job resumes from its last checkpoint while attempts remain)"
    )
    log.error("job %s epoch %s: %s", job.id, epoch, message)
    try:
        with session_scope() as session:
            lifecycle.fence(session, job.id, epoch)
            lifecycle.add_event(session, job.id, "rank_failed", message,
                                {"rank": rank, "devices": job.devices})  # fmt: skip
    except Exception:  # the lease lost, or the database away: the watchdog ends it either way
        log.warning("could not record the rank failure of job %s", job.id, exc_info=True)
