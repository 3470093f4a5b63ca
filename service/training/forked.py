"""Training processes forked from a worker that imported the engine once.

A Celery worker imports the engine (torch, transformers, `workers.grpo`) and the run's own
modules in its main process (`preload`, on `worker_init`), before it forks the pool process of
each task; the watchdog forks the training process from that pool process (`start`), as the
pre-flight and evaluation supervisors fork their runs, instead of starting a fresh interpreter
that imports them again (3.5-4 CPU-s, most of a tiny job's start).

The child is what `subprocess.Popen(command, process_group=0)` gave, with the modules already
loaded: a process group of its own, and none of the pool process's state that it could use by
mistake:
- database connections: SQLAlchemy's rule after a fork, `dispose(close=False)` (the pool
  process goes on using them; psycopg never closes a connection another process opened);
- the Celery app (a fresh one connects on first use), standard streams (Celery's logging
  proxies), signal handlers (Python's defaults), exit functions (the pool process's) and
  multiprocessing's idea of the current process (the pool's daemonic worker, which may
  start no process: the launcher's ranks) and of its forkserver (the parent's, if it has one).
Nothing `PRELOAD` imports asks CUDA anything (tests/service/jobs/test_forked.py checks it), and
PyTorch asks NVML instead of the CUDA driver whether a device exists
(PYTORCH_NVML_BASED_CUDA_CHECK), so the training process is the first to initialise its
device, as a fresh interpreter was: CUDA cannot be used in a child forked after its parent
initialised it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from service.process_group import exit_status

# What a training process imports before its first step (the engine, the model code shared
# by transformers' architectures, the run's storage, scorers and trackers' glue).
PRELOAD = (
    "service.training.runner",
    "service.training.ranks",
    "workers.grpo.trainer",
    "workers.grpo.model_eval",
    "workers.grpo.preflight",
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "transformers.generation.utils",
    "peft",
)


def preload() -> None:
    """Import `PRELOAD` here, once, for every process this one forks."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    for name in PRELOAD:
        importlib.import_module(name)


class ForkedProcess:
    """A forked child, with what the supervisors use of `subprocess.Popen`'s interface."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and timeout is not None:
            with selectors.DefaultSelector() as sel, _pidfd(self.pid) as fd:
                sel.register(fd, selectors.EVENT_READ)  # readable once the child has exited
                if not sel.select(timeout):
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # reaped: its pid may be another's now
            os.kill(self.pid, sig)


@contextlib.contextmanager
def _pidfd(pid: int) -> Iterator[int]:
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def start(
    entry: Callable[..., int], *args: Any, env: dict[str, str], close: tuple[int, ...] = ()
) -> ForkedProcess:
    """Fork a child that runs `entry(*args)` with `env` added to its environment, in a
    process group of its own, and exits with the status it returns; it closes its copies of
    the descriptors in `close` (this process's end of a pipe to it)."""
    pid = os.fork()
    if pid == 0:
        code: object = 1
        try:
            code = _child(entry, args, env, close)
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001 (reported as an interpreter would)
            traceback.print_exc()
        finally:
            os._exit(exit_status(code))  # never back into the parent's code
    # Also here, as a shell does: a kill of the group must not find it missing yet.
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    return ForkedProcess(pid)


def _child(
    entry: Callable[..., int], args: tuple[Any, ...], env: dict[str, str], close: tuple[int, ...]
) -> int:
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    for fd in close:
        os.close(fd)
    _default_signals()
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    atexit._clear()  # the pool process's exit functions are not this process's
    os.environ.update(env)
    _forget_parent_connections()
    _main_to_multiprocessing()
    try:
        return entry(*args)
    finally:
        # What an interpreter does at exit, short of unloading its modules: wait for its
        # threads, run its exit functions (the trackers' libraries finish), flush its streams.
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def _default_signals() -> None:
    """The handlers a fresh interpreter starts with."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler: Any = signal.SIG_DFL
        if sig == signal.SIGINT:
            handler = signal.default_int_handler
        elif sig in (signal.SIGPIPE, signal.SIGXFSZ):
            handler = signal.SIG_IGN
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, handler)


def _main_to_multiprocessing() -> None:
    """To `multiprocessing`, this process is a main process with no children (the launcher
    starts the ranks through it), not the pool's daemonic worker it was forked from (billiard
    marks its pool processes so in the standard library's state as well, and a daemonic
    process may start none)."""
    from multiprocessing import current_process, process

    # A main process's configuration (`multiprocessing.process._MainProcess`): not daemonic,
    # and an authentication key of the standard library's type (billiard's refuses to be
    # sent to a forkserver).
    key = process.AuthenticationString(os.urandom(32))
    current_process()._config = {"authkey": key, "semprefix": "/mp"}  # type: ignore[attr-defined]
    process._children = set()  # type: ignore[attr-defined]
    _no_forkserver()


def _no_forkserver() -> None:
    """Forget a forkserver the parent started: it is no child of this process (the standard
    library's check that it still runs, a wait, fails) and it forks with the parent's
    environment. This process starts its own when it first needs one."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # type: ignore[attr-defined]
    if server._forkserver_alive_fd is not None:  # the parent's server exits when it does
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
    server.__init__()  # no server, no preload, and a lock no thread of the parent holds


def _forget_parent_connections() -> None:
    from service.core.db import forget_engines
    from service.worker import forget_celery_apps

    forget_engines(close=False)
    forget_celery_apps()
