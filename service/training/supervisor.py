"""The run supervisor: one loop that sees a leased run (a job's attempt, an evaluation, a
pre-flight) through, from the Celery pool process, which runs no tenant code.

What differs between the kinds of run is a small description (`RunKind`, the three in
`kinds.py`): its table's claim, renew and outcome transitions, its child module, its budgets.
`supervise` claims the row under a lease, starts the run in a fresh interpreter
(`python -m <child> ID EPOCH SUPERVISOR_PID`, a process group of its own, the write end of the
progress pipe in GRPO_PROGRESS_FD) and then, until that process ends:
- reads its progress beacons (`progress.py`);
- renews the lease every GRPO_HEARTBEAT_SECONDS, but only while the run is alive and within
  its budgets: a run spinning in C with the GIL held, or frozen, cannot stop the heartbeat (it
  shares no GIL with it), and a hung one cannot keep it either;
- kills the process group when a step shows no progress within the queue's step budget
  (GRPO_STEP_TIMEOUT_S or the queue's `step_timeout_s`; GRPO_STARTUP_TIMEOUT_S before the
  first step), or the run outlives the kind's total budget, and records the attempt's end
  (`step_timeout`, `verifier_timeout` when a verifier's batch was under way, or the kind's
  total-budget code);
- kills it when the row was cancelled and it has not stopped within GRPO_CANCEL_GRACE_S;
- passes SIGTERM (the worker shutting down) on to it: it hands its row back;
- kills it when the lease is lost, or cannot be renewed for 0.8 x the lease (a database that
  stays away), so that two live runs of one row never overlap.
A run that dies on its own (an OOM kill, a segfault) ends the attempt too. A run whose
supervisor dies dies with it (PR_SET_PDEATHSIG); its lease lapses and the reconciler takes the
row back (`reconciler.py`).

Each run is a fresh interpreter, not a fork of this process: nothing of the Celery pool
process's state (connections, signal handlers, atexit, multiprocessing's idea of itself)
reaches tenant code, at the price of importing the engine once per run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from service.core.db import session_scope
from service.core.leases import LeaseLost
from service.process_group import kill_tree
from service.settings import Settings, get_settings
from service.training.child import DONE, LEFT_TO_RECONCILER
from service.training.progress import FD_ENV, Progress
from workers.observability import job_context

log = logging.getLogger(__name__)
POLL_S = 0.25
LEASE_LOST_GRACE_S = 5.0

Cause = dict[str, Any]


@dataclass(frozen=True)
class Claim:
    """What a claim hands the supervisor: the lease's epoch and the row's queue."""

    epoch: int
    queue: str
    tenant_id: str
    devices: int = 1


@dataclass(frozen=True)
class RunKind:
    """What differs between the runs one supervisor sees through.

    `claim` takes the row (in its own transaction; None: not claimable), `renew` extends the
    lease in `session` and returns the row's status (`cancelling` asks the run to stop) or
    raises LeaseLost, `end` records an attempt's end that the run could not record itself
    (killed, crashed) in `session` and returns the row's new status (`queued`: `enqueue` it).
    `total_budget` bounds a run from its start, whatever its progress (None: no bound)."""

    name: str  # "job", "evaluation", "pre-flight": logs
    process: str  # "the training process": messages
    child: str  # the module run as `python -m child ID EPOCH SUPERVISOR_PID`
    claim: Callable[[str, Settings], Claim | None]
    renew: Callable[[Session, str, int, Settings], str]
    end: Callable[[Session, str, int, Cause, Settings], str | None]
    enqueue: Callable[[str, Claim], None]
    total_budget: Callable[[Settings], float | None] = lambda _settings: None
    total_code: str = "timeout"  # the error code of a run past its total budget
    total_setting: str = ""  # the setting that names the total budget, for messages


def supervise(
    kind: RunKind, row_id: str, settings: Settings | None = None, command: list[str] | None = None
) -> bool:
    """Claim the row and see one attempt at it through (`command`, a program run instead of the
    kind's child, is for tests); False when it was not claimable."""
    settings = settings or get_settings()
    claim = kind.claim(row_id, settings)
    if claim is None:
        log.info("%s %s is not claimable (taken or final)", kind.name, row_id)
        return False
    job_context.set({"job_id": row_id, "epoch": claim.epoch})
    log.info("claimed %s %s (epoch %d)", kind.name, row_id, claim.epoch)
    run = Supervisor(kind, row_id, claim, settings)
    try:
        with run.passing_sigterm_on():
            run.start(command)
            run.run()
    finally:
        run.close()
    return True


class Supervisor:
    """One attempt at one row: the run's process, its beacons, its lease and its budgets."""

    def __init__(self, kind: RunKind, row_id: str, claim: Claim, settings: Settings) -> None:
        self.kind, self.row_id, self.claim, self.settings = kind, row_id, claim, settings
        self.epoch = claim.epoch
        self.step_budget = settings.step_timeout_for(claim.queue)
        self.total_budget = kind.total_budget(settings)
        self.proc: subprocess.Popen[bytes] | None = None
        self.progress = Progress()
        self._fd: int | None = None
        self._started = self._renewed = self._next_renew = time.monotonic()
        self._cancel_seen: float | None = None
        self._term_pending = False

    # -- the run's process ----------------------------------------------------------------
    def start(self, command: list[str] | None = None) -> None:
        """Start the run in a fresh interpreter, in a process group of its own, with the write
        end of the progress pipe (`command` in its place, for tests)."""
        argv = command or [
            sys.executable, "-m", self.kind.child, self.row_id, str(self.epoch), str(os.getpid())
        ]  # fmt: skip
        read, write = os.pipe()
        try:
            env = {**os.environ, FD_ENV: str(write)}
            self.proc = subprocess.Popen(argv, pass_fds=(write,), env=env, process_group=0)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        os.set_blocking(read, False)
        self._fd = read
        self.progress = Progress()  # the start-up clock starts now
        self._started = time.monotonic()
        if self._term_pending:
            self._pass_sigterm()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.proc is not None and self.proc.poll() is None:  # an error in this process
            self.kill()

    def kill(self) -> None:
        """SIGKILL the run, its group and every descendant (the verifier sandboxes live in
        sessions of their own), and reap it."""
        if self.proc is None or self.proc.poll() is not None:  # reaped: its pid may be reused
            return
        kill_tree(self.proc)

    @contextlib.contextmanager
    def passing_sigterm_on(self) -> Iterator[None]:
        """SIGTERM here (the worker shutting down) goes on to the run, which hands its row
        back (a job at its next step boundary); this process keeps watching it."""
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
                    f"{self.kind.process} did not stop within {self._grace:g}s of the cancel "
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
            if not data:  # the run is gone (or closed its end)
                os.close(self._fd)
                self._fd = None
                return
            self.progress.feed(data)

    def _overrun(self, now: float) -> Cause | None:
        """The verdict on the run's budgets: the cause of the kill, or None while within them."""
        total = self.total_budget
        if total is not None and now - self._started > total:
            message = (
                f"{self.kind.process} did not finish within {total:g}s "
                f"({self.kind.total_setting}) and was killed"
            )
            return {"code": self.kind.total_code, "message": message, "watchdog": True,
                    "budget_s": total}  # fmt: skip
        p, process = self.progress, self.kind.process
        budget = self.step_budget if p.started else self.settings.startup_timeout_s
        if now - p.since <= budget:
            return None
        where = f"queue {self.claim.queue!r}"
        if not p.started:
            message = (
                f"{process} did not begin its first step within {budget:g}s "
                f"(GRPO_STARTUP_TIMEOUT_S) and was killed"
            )
            return {"code": "step_timeout", "message": message, "watchdog": True,
                    "budget_s": budget}  # fmt: skip
        if p.verifier is not None:
            message = (
                f"step {p.step}: verifier {p.verifier!r} was still scoring after "
                f"{now - p.verifier_since:.0f}s, and the step ran past its budget of {budget:g}s "
                f"({where}); {process} was killed"
            )
            return {"code": "verifier_timeout", "message": message, "watchdog": True,
                    "step": p.step, "verifier": p.verifier, "budget_s": budget}  # fmt: skip
        message = (
            f"step {p.step} ran past its budget of {budget:g}s ({where}) without progress; "
            f"{process} was killed"
        )
        return {"code": "step_timeout", "message": message, "watchdog": True,
                "step": p.step, "budget_s": budget}  # fmt: skip

    def _renew(self, now: float) -> bool:
        """One heartbeat; False when the attempt is over (the lease lost or unrenewable)."""
        name, row_id = self.kind.name, self.row_id
        try:
            with session_scope() as session:
                status = self.kind.renew(session, row_id, self.epoch, self.settings)
        except LeaseLost:
            # Either the run itself just ended the row (finished, or handed it back: let it),
            # or the row was taken over: it can write nothing, stop it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=LEASE_LOST_GRACE_S)  # type: ignore[union-attr]
            if self.proc.poll() is None:  # type: ignore[union-attr]  # not a run that ended it
                log.warning("%s %s epoch %s lost its lease; stopping it", name, row_id, self.epoch)
                self.kill()
            return False
        except Exception:  # the database unreachable: keep trying while the lease lasts
            log.exception("heartbeat for %s %s failed", name, row_id)
            if time.monotonic() - self._renewed > 0.8 * self.settings.lease_seconds:
                # Stop before the lease can be taken over: never two live runs at once.
                log.error("%s %s: lease about to expire unrenewed; stopping it", name, row_id)
                self.kill()
                return False
        else:
            self._renewed = now
            if status == "cancelling" and self._cancel_seen is None:
                log.info("%s %s is being cancelled; it stops at its next step", name, row_id)
                self._cancel_seen = now
        self._next_renew = now + self.settings.heartbeat_seconds
        return True

    # -- ends of an attempt ---------------------------------------------------------------
    def _exited(self, rc: int) -> None:
        if rc in (DONE, LEFT_TO_RECONCILER):
            return  # the outcome is recorded, or left to the lease and the reconciler
        message = f"{self.kind.process} died ({_describe(rc)})"
        self._end({"code": "crashed", "message": message, "watchdog": False}, kill=False)

    def _end(self, cause: Cause, kill: bool) -> None:
        name, row_id = self.kind.name, self.row_id
        if kill:
            log.error("%s %s epoch %s: %s", name, row_id, self.epoch, cause["message"])
            self.kill()
        try:
            with session_scope() as session:
                status = self.kind.end(session, row_id, self.epoch, cause, self.settings)
        except Exception:  # the lease lapses; the reconciler moves the row on
            log.exception("%s %s: could not record the end of its attempt", name, row_id)
            return
        if status == "queued":
            self.kind.enqueue(row_id, self.claim)
        if status is not None:
            log.info("%s %s epoch %s ended: %s", name, row_id, self.epoch, status)


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"
