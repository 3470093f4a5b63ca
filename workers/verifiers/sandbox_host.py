"""The supervisor of one long-lived sandboxed child: the part python verifiers and multi-turn
environments (workers/environments) share.

A batch goes to the child over stdin (`process.py` launches it, under bubblewrap unless the
operator explicitly allowed the unsafe mode); results come back in framed chunks carrying a
per-run nonce and item indexes, one frame per item, and the caller's `accept` turns each raw
item into its own result type (a protocol violation raises). A batch has a wall-clock deadline
capped by what is left of the per-job time budget (`budget.py`). On any breach (timeout, death,
load error, protocol violation) the whole sandbox is SIGKILLed and a fresh child serves the
next batch; the items answered before the breach keep their results.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from . import process
from .budget import Budget
from .sandbox import TMP_BYTES

T = TypeVar("T")


@dataclass(frozen=True)
class ChildLimits:
    """rlimits the bootstrap applies before the user code loads, and the sandbox's cgroup."""

    memory_bytes: int = 1 << 30  # RLIMIT_AS
    file_bytes: int = 1 << 20  # RLIMIT_FSIZE
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int | None = 1  # RLIMIT_NPROC: no fork, no threads (the child runs as nobody)
    cpu_s: int | None = 3600  # RLIMIT_CPU hard cap over the child's life; per-batch soft cap
    # memory.max of the sandbox's cgroup, where the host has one; None: what the sandbox may
    # legitimately hold, its address space plus its /tmp. RLIMIT_AS stays the first line (a
    # clean MemoryError); the cgroup catches whatever memory escapes it.
    cgroup_memory_bytes: int | None = None

    @property
    def cgroup_bytes(self) -> int:
        return self.cgroup_memory_bytes or self.memory_bytes + TMP_BYTES

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory_bytes": self.memory_bytes,
            "file_bytes": self.file_bytes,
            "open_files": self.open_files,
            "processes": self.processes,
            "cpu_s": self.cpu_s,
        }


@dataclass
class SandboxStats:
    timeouts: int = 0
    crashes: int = 0
    spawns: int = 0


class _LoadError(Exception):
    pass


class SandboxHost:
    """Runs batches on one sandboxed child, started at the first batch and after each breach.

    `init` is the child's init frame less what `process.spawn` adds (source, entry, limits,
    optionally a trusted `runtime`: see `_bootstrap.py`); `what` names the thing in failure
    texts ("verifier", "environment"). Not thread-safe: the owner serialises calls.
    """

    def __init__(
        self,
        mode: str,
        init: dict[str, Any],
        limits: ChildLimits,
        *,
        what: str,
        stats: SandboxStats | None = None,
    ) -> None:
        self.mode, self.init, self.limits, self.what = mode, init, limits, what
        self.stats = stats if stats is not None else SandboxStats()
        self.child: process.Child | None = None
        self.loaded = False  # the last batch's child had loaded the source (said ready)
        self._batch_id = 0

    def kill(self) -> int | None:
        child, self.child = self.child, None
        return None if child is None else process.kill(child)

    def __del__(self) -> None:
        if sys is not None and getattr(self, "child", None) is not None:
            self.kill()

    def run(
        self,
        payload: list[bytes],
        *,
        timeout_s: float,
        budget: Budget,
        accept: Callable[[list[Any]], T],
    ) -> tuple[list[T | None], str | None]:
        """Send one batch (each item JSON-encoded) and collect its results: (results, failure).

        A result is None where the child never answered (the failure says why).
        """
        wait_s = min(timeout_s, max(budget.remaining_s(), 0.0))
        deadline = time.monotonic() + wait_s
        out = bytearray()
        if self.child is None:
            init = {**self.init, "limits": self.limits.as_dict()}
            self.child, first = process.spawn(
                self.mode, init, memory_bytes=self.limits.cgroup_bytes
            )
            self.stats.spawns += 1
            out += first
        child = self.child
        self._batch_id += 1
        b = self._batch_id
        head = json.dumps({"b": b, "timeout_s": timeout_s}).encode()[:-1] + b', "items": ['
        body = head + b", ".join(payload) + b"]}"
        out += len(body).to_bytes(4, "big") + body
        results: list[T | None] = [None] * len(payload)
        failure: str | None = None
        recycle = False
        try:
            recycle = self._exchange(child, b, memoryview(bytes(out)), deadline, results, accept)
        except TimeoutError:
            self.stats.timeouts += 1
            if wait_s < timeout_s:
                failure = f"timeout: the {self.what}'s time budget ({budget.time_s:g}s) ran out"
            else:
                failure = f"timeout after {timeout_s:g}s"
        except EOFError:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=1)  # let bwrap report the child's own exit status
            rc = self.kill()
            self.stats.crashes += 1
            failure = f"{self.what} process died" + process.describe_exit(rc, child.mode)
            if child.oom_killed:
                mib = self.limits.cgroup_bytes / (1 << 20)
                failure += f": out of memory (the sandbox's memory limit is {mib:g} MiB)"
        except _LoadError as exc:
            failure = f"{self.what} failed to load: {exc}"
        except process.ProtocolError as exc:
            failure = f"{self.what} protocol violation: {exc}"
        self.loaded = child.ready
        if failure is not None or recycle:
            self.kill()  # the whole sandbox; a fresh one serves the next batch
        return results, failure

    def _exchange(
        self,
        child: process.Child,
        b: int,
        view: memoryview,
        deadline: float,
        results: list[Any],
        accept: Callable[[list[Any]], Any],
    ) -> bool:
        """Pump stdin and the result pipe until the batch is done; returns `recycle`."""
        stdin_fd = child.stdin_fd
        with selectors.DefaultSelector() as sel:
            sel.register(child.result_fd, selectors.EVENT_READ)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                for key, _ in sel.select(remaining):
                    if key.fd == stdin_fd:
                        try:
                            view = view[os.write(stdin_fd, view[: 1 << 20]) :]
                        except BlockingIOError:
                            continue
                        except OSError:
                            view = view[:0]  # the child is gone; EOF on results follows
                        if not view:
                            sel.unregister(stdin_fd)
                        continue
                    try:
                        data = os.read(child.result_fd, 1 << 20)
                    except BlockingIOError:
                        continue
                    if not data:
                        raise EOFError
                    child.buf += data
                    for obj in child.frames():
                        if _handle(child, b, obj, results, accept):
                            return bool(obj.get("recycle"))


def _handle(
    child: process.Child,
    b: int,
    obj: dict[str, Any],
    results: list[Any],
    accept: Callable[[list[Any]], Any],
) -> bool:
    """Apply one frame; True when the batch is complete."""
    if not child.ready:
        if "load_error" in obj:
            raise _LoadError(str(obj["load_error"])[:500])
        if obj.get("ready") is True:
            child.ready = True
            return False
        raise process.ProtocolError("expected a ready frame")
    if obj.get("b") != b:
        raise process.ProtocolError("frame for another batch")
    if obj.get("done") is True:
        if any(r is None for r in results):
            raise process.ProtocolError("batch ended with items unanswered")
        return True
    chunk = obj.get("r")
    if not isinstance(chunk, list):
        raise process.ProtocolError("expected results")
    n = len(results)
    for item in chunk:
        i = item[0] if isinstance(item, list) and item else None
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise process.ProtocolError("bad item index")
        if results[i] is not None:
            raise process.ProtocolError(f"second result for item {i}")
        results[i] = accept(item)
    return False
