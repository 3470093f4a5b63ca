"""One verifier child process: launch (sandboxed or not), frame I/O, kill.

Only the transport lives here; what a frame means is `python_kind`'s business. Every child
holds one of the host's sandbox slots (`slots.py`) and, where the host offers one, lives in its
own memory cgroup (`cgroup.py`); both are given back when it is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import cgroup, slots
from .sandbox import SANDBOX_UID, SandboxUnavailableError, bwrap_command, unsafe_command

MAX_RESULT_FRAME = 8 << 20  # 1024 results of at most ~600 bytes each fit easily


class ProtocolError(Exception):
    """The child wrote something that is not a frame of this run."""


def frame(obj: Any) -> bytes:
    data = json.dumps(obj, allow_nan=False).encode()
    return len(data).to_bytes(4, "big") + data


@dataclass
class Child:
    proc: subprocess.Popen[bytes]
    result_fd: int
    nonce: str
    mode: str
    workdir: str | None = None
    slot: slots.Slot | None = None
    memory: cgroup.MemoryCgroup | None = None
    oom_killed: bool = False  # set by kill(): the cgroup's OOM killer ended it
    ready: bool = False
    buf: bytearray = field(default_factory=bytearray)

    @property
    def stdin_fd(self) -> int:
        assert self.proc.stdin is not None
        return self.proc.stdin.fileno()

    def frames(self) -> Iterator[dict[str, Any]]:
        """Complete frames buffered so far; every one must carry the run's nonce."""
        buf = self.buf
        while len(buf) >= 4:
            size = int.from_bytes(buf[:4], "big")
            if size > MAX_RESULT_FRAME:
                raise ProtocolError("oversized frame")
            if len(buf) < 4 + size:
                return
            raw = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError):
                raise ProtocolError("malformed frame") from None
            if not isinstance(obj, dict) or obj.get("n") != self.nonce:
                raise ProtocolError("frame without the run's nonce")
            yield obj


def spawn(mode: str, init: dict[str, Any], *, memory_bytes: int) -> tuple[Child, bytes]:
    """Start a child in `mode` ('bubblewrap' | 'unsafe-subprocess'); returns it and the init
    frame to send first. The child runs in its own session, so killpg reaches all of it, and
    in a memory cgroup of `memory_bytes` where the host has one.

    Raises SandboxUnavailableError when the host runs its limit of sandboxes already, or has
    cgroups but cannot make this one (a sandbox never runs without the limit it should get).
    """
    slot = slots.acquire()
    try:
        memory = cgroup.create(memory_bytes)
    except OSError as exc:
        slot.release()
        raise SandboxUnavailableError(f"cannot make the sandbox's memory cgroup: {exc}") from exc
    r, w = os.pipe()
    workdir = None
    try:
        if mode == "bubblewrap":
            argv, cwd = bwrap_command(w), "/"
        else:  # explicitly allowed: an isolated interpreter in a throw-away directory
            workdir = cwd = tempfile.mkdtemp(prefix="grpo-verifier-")
            argv = unsafe_command(w)
        if memory is not None:
            argv = memory.wrap(argv)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(w,),
            env={} if mode == "bubblewrap" else {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        os.close(r)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        if memory is not None:
            memory.remove()
        slot.release()
        raise
    finally:
        os.close(w)
    os.set_blocking(r, False)
    assert proc.stdin is not None
    os.set_blocking(proc.stdin.fileno(), False)
    nonce = secrets.token_hex(16)
    # Root inside bwrap drops to nobody (see sandbox.py); the unsafe mode cannot (the runtime
    # may live under /root) and stays whoever the worker is.
    drop_to = SANDBOX_UID if mode == "bubblewrap" and os.geteuid() == 0 else None
    init = {**init, "nonce": nonce, "uid": drop_to, "seccomp": True}
    child = Child(proc=proc, result_fd=r, nonce=nonce, mode=mode, workdir=workdir)
    child.slot, child.memory = slot, memory
    return child, frame(init)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def kill(child: Child) -> int | None:
    """SIGKILL the whole sandbox and reap it; returns its exit status.

    Under bubblewrap the sandboxed processes live in their own session and PID namespace
    below bwrap's monitor process. Killing the namespace's init first makes the kernel kill
    every process in the namespace, and lets the monitor reap it and exit (killing the monitor
    first would orphan init as a zombie of whatever reaps orphans). --die-with-parent, the
    process-group kill below and the cgroup (emptied before it is removed) cover the rest:
    nothing survives. The child's host slot is released last.
    """
    proc = child.proc
    if child.mode == "bubblewrap" and proc.poll() is None:
        for pid in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group id is the child's pid
    try:
        rc = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not hang
        rc = None
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    with contextlib.suppress(OSError):
        os.close(child.result_fd)
    if child.workdir:
        shutil.rmtree(child.workdir, ignore_errors=True)
    memory, child.memory = child.memory, None
    if memory is not None:  # read before it goes: was this death the cgroup's OOM killer?
        child.oom_killed = memory.oom_kills() > 0
        memory.remove()
    slot, child.slot = child.slot, None
    if slot is not None:
        slot.release()
    return rc


def describe_exit(rc: int | None, mode: str) -> str:
    """' (killed by SIGSEGV)' / ' (exit code 1)'. bwrap reports a child killed by signal N
    as exit status 128 + N."""
    if rc is None:
        return ""
    if mode == "bubblewrap" and 128 < rc < 128 + 65:
        rc = -(rc - 128)
    if rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = str(-rc)
        extra = " (CPU time limit)" if sig == "SIGXCPU" else ""
        return f" (killed by {sig}{extra})"
    return f" (exit code {rc})"
