"""The training process is forked from the worker's pool process with the engine loaded
(`service.training.forked`): a process group of its own, the environment and descriptors it
is given, and nothing of its parent's it could use by mistake (database connections, signal
handlers, logging proxies, exit functions). On PostgreSQL, the database whose connections
cannot be shared."""

from __future__ import annotations

import atexit
import io
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import billiard.process
import pytest
from sqlalchemy import text

from service.core.db import forget_engines, session_scope
from service.process_group import kill_tree
from service.settings import environment_settings
from service.training import forked
from tests.service.jobs.conftest import _psql


@pytest.fixture
def pg_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The service's own engine (`get_engine`) on a fresh PostgreSQL database."""
    name = f"grpo_fork_{os.getpid()}"
    _psql(f"CREATE DATABASE {name}")
    monkeypatch.setenv("GRPO_DATABASE_URL", f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
    environment_settings.cache_clear()
    forget_engines(close=True)
    try:
        yield
    finally:
        forget_engines(close=True)
        environment_settings.cache_clear()
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _backend() -> int:
    with session_scope() as session:
        return int(session.scalar(text("SELECT pg_backend_pid()")))


def _report(path: str, closed: int) -> int:
    """In the child: what it sees, written to `path`; exits 7."""
    atexit.register(lambda: Path(path + ".exit").write_text("child"))
    try:
        os.fstat(closed)
        read_end_closed = False
    except OSError:
        read_end_closed = True
    report = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "env": os.environ.get("GRPO_FORK_TEST"),
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "sigusr1_default": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
        "stderr_is_real": sys.stderr is sys.__stderr__,
        "read_end_closed": read_end_closed,
        "backend": _backend(),
        "grandchild_exit": _start_a_process(),
    }
    Path(path).write_text(json.dumps(report))
    return 7


def _start_a_process() -> int | None:
    """As the launcher starts its ranks: through `multiprocessing`'s forkserver."""
    # os._exit: a target the forkserver can unpickle whatever another test did to sys.exit
    process = multiprocessing.get_context("forkserver").Process(target=os._exit, args=(3,))
    process.start()
    process.join(30)
    return process.exitcode


def test_a_forked_child_has_its_own_group_connections_and_handlers(
    pg_engine: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent_backend = _backend()  # a connection the parent's pool keeps
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # as Celery's logging proxy
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    # As Celery's pool process: daemonic to multiprocessing, with billiard's key (billiard
    # sets them so), which may not be sent to a forkserver.
    config = multiprocessing.current_process()._config
    monkeypatch.setitem(config, "daemon", True)
    monkeypatch.setitem(config, "authkey", billiard.process.AuthenticationString(b"k" * 32))
    parent_exit = tmp_path / "parent-exit"

    def parents_exit_function() -> None:
        parent_exit.write_text(str(os.getpid()))

    atexit.register(parents_exit_function)
    # The parent has a forkserver of its own running (the child cannot wait for it, nor may
    # its ranks be started with the parent's environment).
    multiprocessing.forkserver.ensure_running()
    read, write = os.pipe()
    try:
        child = forked.start(
            _report, str(tmp_path / "r"), read, env={"GRPO_FORK_TEST": "yes"}, close=(read,)
        )
        assert child.wait(timeout=60) == 7 and child.returncode == 7
    finally:
        atexit.unregister(parents_exit_function)
        signal.signal(signal.SIGUSR1, previous)
        os.close(read)
        os.close(write)
    report = json.loads((tmp_path / "r").read_text())
    assert report["pgid"] == report["pid"] == child.pid != os.getpgid(0)
    assert report["env"] == "yes" and "GRPO_FORK_TEST" not in os.environ
    assert report["sigterm_default"] and report["sigusr1_default"] and report["stderr_is_real"]
    assert report["read_end_closed"]
    assert report["grandchild_exit"] == 3  # it may start processes of its own
    assert report["backend"] != parent_backend  # a connection of its own
    assert _backend() == parent_backend  # and the parent's still works
    assert (tmp_path / "r.exit").read_text() == "child"  # its own exit functions ran
    assert not parent_exit.exists()  # the parent's did not


def _sleep_with_a_grandchild(path: str) -> int:
    grandchild = subprocess.Popen(["sleep", "600"], start_new_session=True)
    Path(path).write_text(str(grandchild.pid))
    time.sleep(600)
    return 0


def test_a_forked_child_is_polled_signalled_and_killed_with_its_descendants(
    tmp_path: Path,
) -> None:
    child = forked.start(time.sleep, 600, env={})
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM
    child.send_signal(signal.SIGTERM)  # reaped: nothing is signalled

    assert forked.start(lambda: None, env={}).wait(timeout=30) == 0  # as sys.exit(None)
    assert forked.start(sys.exit, "why", env={}).wait(timeout=30) == 1

    marker = tmp_path / "grandchild"
    child = forked.start(_sleep_with_a_grandchild, str(marker), env={})
    deadline = time.monotonic() + 30
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    kill_tree(child)
    assert child.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while Path(f"/proc/{grandchild}").exists() and _state(grandchild) != "Z":
        assert time.monotonic() < deadline, "the grandchild outlived the kill"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_the_preload_asks_nothing_of_cuda() -> None:
    """Had an import of the worker's preload asked CUDA anything (even `is_available`, which
    initialises the driver unless told to ask NVML), a training process forked after it could
    not initialise its GPU."""
    code = """
import torch

def refuse(*args, **kwargs):
    raise SystemExit("CUDA asked at import")

for name in ("is_available", "device_count", "init", "_lazy_init", "current_device"):
    setattr(torch.cuda, name, refuse)
from service.training import forked
forked.preload()
print("preloaded", len(forked.PRELOAD), torch.cuda.is_initialized())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["preloaded", str(len(forked.PRELOAD)), "False"], out.stdout
