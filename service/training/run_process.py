"""How a run's process starts: forked from the standard library's forkserver, which imported
the engine once (`PRELOAD`: torch, transformers, the run modules), instead of a fresh
interpreter importing them for every run (seconds of CPU before a run could begin).

The forkserver is itself a fresh interpreter that `multiprocessing` starts from the supervisor
(the Celery pool process) at its first run and that only imports: no connection, thread,
signal handler or lease of the supervisor's reaches a run, as with `python -m`. What each run
gets, as a fresh interpreter would: the supervisor's environment of the moment (`env`), the
write end of the progress pipe (its number in GRPO_PROGRESS_FD), a process group of its own,
and death with its parent (PR_SET_PDEATHSIG, `child.enter`). Its parent is the forkserver,
which exits when the supervisor does (its `alive` pipe closes): so a run still never outlives
its supervisor, provided it holds no copy of that pipe's write end, which `multiprocessing`
hands every child and `_forget_the_forkservers_pipe` closes first thing.

A run module (`RunKind.child`) defines `main_process(argv) -> int`, the process's life from
`[ID, EPOCH, PARENT_PID]` to its exit status; its `python -m` form runs the same.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing
import os
import signal
from multiprocessing import connection, forkserver
from typing import Any

from service.training.progress import FD_ENV

# What the forkserver imports once. Torch and the model classes are most of a run's start;
# a module that fails to import here is imported by the run itself (and fails there, loudly).
PRELOAD = [
    "service.training.forkserver_init",
    "service.training.run_process",
    "service.training.train_process",
    "service.training.runner",
    "service.training.evaluation_run",
    "service.training.preflight_run",
    "workers.grpo.trainer",
    "workers.models.loading",
    "transformers.models.llama.modeling_llama",
]
# In a run, the forkserver's pid (this module was imported there, then forked).
_IMPORTED_BY = os.getpid()


class RunProcess:
    """A run's process, as the supervisor sees it (the parts of `subprocess.Popen` it uses)."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        self.pid: int = process.pid  # type: ignore[assignment]

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        self._process.join(timeout)
        if (code := self._process.exitcode) is None:
            raise subprocess.TimeoutExpired(f"run {self.pid}", timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)


def warm() -> None:
    """Return once the forkserver (started if need be) has imported PRELOAD. The supervisor
    calls it before it takes a lease: a run's start, which waits for that import, then never
    keeps the lease from being renewed (the import takes seconds, the lease may be short)."""
    global _warm_server
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    _own_process_for_multiprocessing()
    forkserver.ensure_running()
    server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    if server != _warm_server:  # a new forkserver: its first child starts after the import
        ready = context.Process(target=_nothing, name="forkserver ready")  # type: ignore[attr-defined]
        ready.start()
        ready.join()
        _warm_server = server


_warm_server: int | None = None


def _nothing() -> None:
    pass


def start(module: str, args: list[str], env: dict[str, str], progress_fd: int) -> RunProcess:
    """Fork the run `module` with `args` (its ID and EPOCH) from the forkserver; `progress_fd`
    (the pipe's write end) is passed on, and stays open here for the caller to close."""
    warm()
    context = multiprocessing.get_context("forkserver")
    pipe = connection.Connection(os.dup(progress_fd), readable=False)
    try:
        process = context.Process(  # type: ignore[attr-defined]
            target=_run, args=(module, args, env, pipe), name=f"run {module}", daemon=False
        )
        process.start()
    finally:
        pipe.close()
    return RunProcess(process)


def _own_process_for_multiprocessing() -> None:
    """Celery's pool process is a billiard process, which billiard installs as multiprocessing's
    current process too: a daemon (multiprocessing lets no daemon start a child) whose authkey
    multiprocessing may not pickle (billiard's own type). Both are made multiprocessing's: its
    runs are not children to terminate at its exit (the supervisor sees each to its end, and a
    run dies with it)."""
    from multiprocessing import process

    me: Any = process.current_process()
    if not isinstance(me, process.BaseProcess):
        me._config["daemon"] = False
        me._config["authkey"] = process.AuthenticationString(bytes(me.authkey))


def _run(module: str, args: list[str], env: dict[str, str], pipe: connection.Connection) -> None:
    """In the run: its own group, its environment, its pipe, then the module's life."""
    os.setpgid(0, 0)
    _forget_the_forkservers_pipe()
    from service.training import forkserver_init  # the forkserver's (never the supervisor's)

    atexit.unregister(forkserver_init.leave_at_once)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as `python -m` starts: the run binds it
    fd = os.dup(pipe.fileno())
    pipe.close()
    os.environ.clear()
    os.environ.update({**env, FD_ENV: str(fd)})
    code = importlib.import_module(module).main_process([*args, str(_IMPORTED_BY)])
    atexit._run_exitfuncs()  # what a `python -m` run's exit runs (trackers finish their runs)
    raise SystemExit(code)  # multiprocessing then joins the threads, flushes and exits


def _forget_the_forkservers_pipe() -> None:
    """Close this process's copy of the write end of the pipe whose closing tells the
    forkserver that the supervisor is gone: held here, it would keep the forkserver (and with
    it, through PR_SET_PDEATHSIG, this run) alive after the supervisor died."""
    server: Any = forkserver._forkserver  # type: ignore[attr-defined]
    fd = server._forkserver_alive_fd
    server._forkserver_alive_fd = None
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
