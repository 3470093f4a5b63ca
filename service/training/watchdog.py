"""The watchdog: holds a job's lease while a separate training process trains it.

The Celery task runs this in the worker's pool process, which runs no tenant code. It claims
the job, starts `train_process` in a process group of its own and then, until that process
ends:
- reads its progress beacons (`progress.py`);
- renews the lease every GRPO_HEARTBEAT_SECONDS, but only while the process is alive and
  within its budget: a training process spinning in C with the GIL held, or frozen, cannot
  stop the heartbeat (it shares no GIL with it), and a hung one cannot keep it either;
- kills the process group when a step shows no progress within the queue's step budget
  (GRPO_STEP_TIMEOUT_S, or the queue's `step_timeout_s`; GRPO_STARTUP_TIMEOUT_S before the
  first step) and ends the attempt: requeued, or after the last attempt failed with
  `step_timeout` / `verifier_timeout` (a verifier's batch was under way) when every attempt
  ended so;
- kills it when the job was cancelled and it has not stopped within GRPO_CANCEL_GRACE_S;
- passes SIGTERM (the worker shutting down) on to it: it checkpoints at its next step
  boundary and hands the job back;
- kills it when the lease is lost, or cannot be renewed for 0.8 x the lease (a database that
  stays away), so that two live runs of one job never overlap.
A training process that dies on its own (an OOM kill, a segfault) ends the attempt too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

from service.core.db import session_scope
from service.jobs import lifecycle
from service.process_group import kill_tree
from service.settings import Settings, get_settings
from service.training import forked, train_process
from service.training.progress import FD_ENV, Progress
from service.training.runner import DONE, LEFT_TO_RECONCILER, claim_job
from service.worker import enqueue_training
from workers.observability import job_context

log = logging.getLogger(__name__)
POLL_S = 0.25
LEASE_LOST_GRACE_S = 5.0


def supervise_job(
    job_id: str, settings: Settings | None = None, command: list[str] | None = None
) -> None:
    """Claim the job and see one attempt at it through (`command`, a program run instead of
    the training process, is for tests)."""
    settings = settings or get_settings()
    claimed = claim_job(job_id, settings)
    if claimed is None:
        return
    job, epoch = claimed
    job_context.set({"job_id": job_id, "epoch": epoch})
    log.info("claimed job %s (epoch %d)", job_id, epoch)
    watch = Watchdog(job_id, epoch, job.queue, settings, job.devices)
    try:
        with watch.passing_sigterm_on():
            watch.start(command)
            watch.run()
    finally:
        watch.close()


class Watchdog:
    def __init__(
        self, job_id: str, epoch: int, queue: str, settings: Settings, devices: int = 1
    ) -> None:
        self.job_id, self.epoch, self.queue, self.settings = job_id, epoch, queue, settings
        self.devices = devices
        self.step_budget = settings.step_timeout_for(queue)
        self.proc: subprocess.Popen[bytes] | forked.ForkedProcess | None = None
        self.progress = Progress()
        self._fd: int | None = None
        self._renewed = self._next_renew = time.monotonic()  # the claim set the lease
        self._cancel_seen: float | None = None
        self._term_pending = False

    # -- the training process -------------------------------------------------------------
    def start(self, command: list[str] | None = None) -> None:
        """Start the training process (forked with the engine loaded: `forked.py`), or
        `command` in its place, with the write end of the progress pipe."""
        read, write = os.pipe()
        try:
            if command is None:
                argv = [self.job_id, str(self.epoch), str(os.getpid())]
                env = {FD_ENV: str(write)}
                self.proc = forked.start(train_process.run, argv, env=env, close=(read,))
            else:
                env = {**os.environ, FD_ENV: str(write)}
                self.proc = subprocess.Popen(command, pass_fds=(write,), env=env, process_group=0)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        os.set_blocking(read, False)
        self._fd = read
        self.progress = Progress()  # the start-up clock starts now
        if self._term_pending:
            self._pass_sigterm()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.proc is not None and self.proc.poll() is None:  # an error in this process
            self.kill()

    def kill(self) -> None:
        """SIGKILL the training process, its group and every descendant (the verifier
        sandboxes live in sessions of their own), and reap it."""
        proc = self.proc
        if proc is None or proc.poll() is not None:  # reaped: its pid may be another's now
            return
        kill_tree(proc)

    @contextlib.contextmanager
    def passing_sigterm_on(self) -> Iterator[None]:
        """SIGTERM here (the worker shutting down) goes on to the training process, which
        hands the job back at its next step boundary; this process keeps watching it."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGTERM, lambda *_: self._pass_sigterm())
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _pass_sigterm(self) -> None:
        if self.proc is None:
            self._term_pending = True
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        assert self.proc is not None
        while True:
            self._read(POLL_S)
            if (rc := self.proc.poll()) is not None:
                self._read(0)
                self._exited(rc)
                return
            now = time.monotonic()
            if cause := self._overrun(now):
                self._end(cause, kill=True)
                return
            if self._cancel_seen is not None and now - self._cancel_seen > self._grace:
                message = (
                    f"the training process did not stop within {self._grace:g}s of the cancel "
                    "(GRPO_CANCEL_GRACE_S) and was killed"
                )
                self._end({"code": "cancel_timeout", "message": message, "watchdog": False}, True)
                return
            if now >= self._next_renew and not self._renew(now):
                return

    @property
    def _grace(self) -> float:
        return self.settings.cancel_grace_s

    def _read(self, timeout: float) -> None:
        """Take in the beacons; waits up to `timeout` for one (the loop's tick)."""
        if self._fd is None:
            if timeout:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout)  # type: ignore[union-attr]
            return
        with selectors.DefaultSelector() as sel:
            sel.register(self._fd, selectors.EVENT_READ)
            if not sel.select(timeout):
                return
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            if not data:  # the training process is gone (or closed its end)
                os.close(self._fd)
                self._fd = None
                return
            self.progress.feed(data)

    def _overrun(self, now: float) -> dict[str, Any] | None:
        """The watchdog's verdict: the cause of the kill, or None while within budget."""
        p = self.progress
        budget = self.step_budget if p.started else self.settings.startup_timeout_s
        elapsed = now - p.since
        if elapsed <= budget:
            return None
        where = f"queue {self.queue!r}"
        if not p.started:
            message = (
                f"the training process did not begin its first step within {budget:g}s "
                f"(GRPO_STARTUP_TIMEOUT_S) and was killed"
            )
            return {"code": "step_timeout", "message": message, "watchdog": True,
                    "budget_s": budget}  # fmt: skip
        if p.verifier is not None:
            message = (
                f"step {p.step}: verifier {p.verifier!r} was still scoring after "
                f"{now - p.verifier_since:.0f}s, and the step ran past its budget of {budget:g}s "
                f"({where}); the training process was killed"
            )
            return {"code": "verifier_timeout", "message": message, "watchdog": True,
                    "step": p.step, "verifier": p.verifier, "budget_s": budget}  # fmt: skip
        message = (
            f"step {p.step} ran past its budget of {budget:g}s ({where}) without progress; the "
            "training process was killed"
        )
        return {"code": "step_timeout", "message": message, "watchdog": True,
                "step": p.step, "budget_s": budget}  # fmt: skip

    def _renew(self, now: float) -> bool:
        """One heartbeat; False when the attempt is over (the lease lost or unrenewable)."""
        lease = self.settings.lease_seconds
        try:
            with session_scope() as session:
                status = lifecycle.renew(session, self.job_id, self.epoch, lease)
        except lifecycle.LeaseLost:
            # Either the run itself just ended the job (finished, or handed it back and is now
            # enqueueing it: let it), or the job was taken over: it can write nothing, stop it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=LEASE_LOST_GRACE_S)  # type: ignore[union-attr]
            if self.proc.poll() is None:  # type: ignore[union-attr]  (not a run that ended it)
                log.warning("job %s epoch %s lost its lease; stopping it", self.job_id, self.epoch)
                self.kill()
            return False
        except Exception:  # the database unreachable: keep trying while the lease lasts
            log.exception("heartbeat for job %s failed", self.job_id)
            if time.monotonic() - self._renewed > 0.8 * lease:
                # Stop before the lease can be taken over: never two live runs at once.
                log.error("job %s: lease about to expire unrenewed; stopping it", self.job_id)
                self.kill()
                return False
        else:
            self._renewed = now
            if status == "cancelling" and self._cancel_seen is None:
                log.info("job %s is being cancelled; it stops at its next step", self.job_id)
                self._cancel_seen = now
        self._next_renew = now + self.settings.heartbeat_seconds
        return True

    # -- ends of an attempt ---------------------------------------------------------------
    def _exited(self, rc: int) -> None:
        if rc in (DONE, LEFT_TO_RECONCILER):
            return  # the outcome is recorded, or left to the lease and the reconciler
        message = f"the training process died ({_describe(rc)})"
        self._end({"code": "crashed", "message": message, "watchdog": False}, kill=False)

    def _end(self, cause: dict[str, Any], kill: bool) -> None:
        if kill:
            log.error("job %s epoch %s: %s", self.job_id, self.epoch, cause["message"])
            self.kill()
        try:
            with session_scope() as session:
                status = lifecycle.end_attempt(
                    session, self.job_id, self.epoch, self.settings.max_attempts, cause
                )
        except Exception:  # the lease lapses; the reconciler moves the job on
            log.exception("job %s: could not record the end of its attempt", self.job_id)
            return
        if status == "queued":
            enqueue_training(self.job_id, self.queue, self.devices)
        log.info("job %s epoch %s ended: %s", self.job_id, self.epoch, status or "not ours")


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"
