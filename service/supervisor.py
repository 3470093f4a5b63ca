"""Run the service's processes (API, worker, inference) as children and stop them together.

Any child exiting stops them all, for the orchestrator (or the user) to start again.

Each child runs in a process group of its own under a small leader (`process_group.py`) that
passes SIGTERM to the whole group, so it reaches a Celery worker's pool child too: the training
task then checkpoints at its next step boundary and hands its lease back (graceful shutdown)
instead of being cut off. The leader also gets SIGTERM from the kernel when this supervisor
dies, even by SIGKILL, so no child outlives it. The reconciler, the webhook dispatcher and the
Tinker checkpoints' expiry pass run as threads here, beside every worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from service.http.http_limits import uvicorn_options


def api_command(host: str, port: int) -> list[str]:
    """The API as one uvicorn process, with the limits `grpo-service api` runs with."""
    return [
        sys.executable, "-m", "uvicorn", "service.main:app", "--host", host,
        "--port", str(port), "--no-access-log", *uvicorn_options(),
    ]  # fmt: skip


def serve_command(host: str, port: int) -> list[str]:
    """One process: its engine thread batches every request it gets (service/serve/app.py)."""
    return [
        sys.executable, "-m", "uvicorn", "service.serve.app:app_from_env", "--factory",
        "--host", host, "--port", str(port), "--no-access-log",
    ]  # fmt: skip


def tinker_worker_command() -> list[str]:
    """The Tinker API's worker (service/tinker/worker.py): it loads torch at its first request."""
    return [sys.executable, "-m", "service.cli", "tinker-worker"]


def worker_command(queue: str) -> list[str]:
    # One job per GPU, a fresh child per job; no broadcast features (the embedded broker has none).
    return [
        sys.executable, "-m", "celery", "-A", "service.worker", "worker", "-Q", queue,
        "-c", "1", "--max-tasks-per-child", "1", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "--loglevel", "INFO",
    ]  # fmt: skip


@dataclass
class Supervisor:
    commands: list[list[str]]
    grace_seconds: float = 600.0
    reconcile: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _loops: list[threading.Thread] = field(default_factory=list)
    _loops_grace_s: float = 0.0

    def run(self) -> int:
        procs = [self._start(cmd) for cmd in self.commands]
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        if self.reconcile:
            self._start_reconciler()
        while not self._stop.is_set() and all(p.poll() is None for p in procs):
            time.sleep(0.2)
        requested = self._stop.is_set()
        self._stop.set()
        for p in procs:  # the leader passes it to its group
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds + 5  # the leaders kill at the grace
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        self._join_loops()
        if requested:
            return 0
        return max((p.returncode or 0) for p in procs) or 1

    def _start(self, command: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._in_own_group(command), start_new_session=True)

    def _in_own_group(self, command: list[str]) -> list[str]:
        leader = [sys.executable, "-m", "service.process_group", str(self.grace_seconds), "--"]
        return [*leader, *command]

    def _start_reconciler(self) -> None:
        """The reconciler and, beside it, the webhook dispatcher (a loop of its own: it wakes
        every `webhook_poll_s`, far more often than the reconciler's passes) and the Tinker
        checkpoints' expiry pass."""
        from service.settings import get_settings
        from service.tinker.checkpoints import expire_forever
        from service.training.reconciler import run_forever
        from service.webhooks.dispatcher import run_forever as dispatch_forever

        settings = get_settings()
        # The dispatcher, stopped, finishes and records its sends under way, each within
        # GRPO_WEBHOOK_TIMEOUT_S: waited for, a restart re-sends nothing it had claimed.
        self._loops_grace_s = settings.webhook_timeout_s + 10
        loops = (("reconciler", run_forever), ("webhooks", dispatch_forever),
                 ("tinker-expiry", expire_forever))  # fmt: skip
        for name, loop in loops:
            thread = threading.Thread(
                target=loop, args=(settings, self._stop), name=name, daemon=True
            )
            thread.start()
            self._loops.append(thread)

    def _join_loops(self) -> None:
        deadline = time.monotonic() + self._loops_grace_s
        for thread in self._loops:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
