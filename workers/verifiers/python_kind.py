"""The `python` verifier kind: user code in one long-lived sandboxed child per verifier.

The supervisor side: batches go to the child over stdin (`process.py` launches it, under
bubblewrap unless the operator explicitly allowed the unsafe mode), results come back in framed
chunks carrying a per-run nonce and item indexes, exactly one finite number per item. A batch
has a wall-clock deadline; the verifier has a per-job time and failure budget (`budget.py`).
On any breach the whole sandbox is SIGKILLed, the failure is counted and a fresh child serves
the next batch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import process
from .base import BaseVerifier, Sample, ScoreResult
from .budget import Budget
from .config import PythonConfig, analyse_python_source
from .sandbox import TMP_BYTES, require_sandbox

Result = tuple[float | None, str | None]


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
class PythonVerifierStats:
    batches: int = 0
    items: int = 0
    errors: int = 0
    timeouts: int = 0
    crashes: int = 0
    spawns: int = 0
    busy_s: float = 0.0  # wall-clock time spent in score()


class _LoadError(Exception):
    pass


class PythonVerifier(BaseVerifier):
    def __init__(
        self,
        name: str,
        config: PythonConfig,
        *,
        limits: ChildLimits | None = None,
        mode: str | None = None,
    ):
        super().__init__(name)
        self.config = config
        self.entry = analyse_python_source(config.source)
        self.limits = limits or ChildLimits()
        self.mode = mode or require_sandbox()  # refuses before anything runs
        self.stats = PythonVerifierStats()
        self.budget = Budget(config.budget_s, config.max_failures)
        self._child: process.Child | None = None
        self._batch_id = 0
        self._lock = threading.Lock()
        self._closed = False

    def _kill(self) -> int | None:
        child, self._child = self._child, None
        return None if child is None else process.kill(child)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._kill()

    def __del__(self) -> None:
        if sys is not None and getattr(self, "_child", None) is not None:
            self._kill()

    # ------------------------------------------------------------------ scoring

    def score(self, samples: list[Sample]) -> ScoreResult:
        """Score a batch; raises VerifierBudgetExceeded once the job's budget is spent."""
        n = len(samples)
        scores: list[float | None] = [None] * n
        errors: list[str | None] = [None] * n
        if n == 0:
            return scores, errors
        send: list[int] = []
        payload: list[bytes] = []
        for i, sample in enumerate(samples):  # one bad record must not sink the batch
            if not isinstance(sample, dict):
                errors[i] = f"sample must be an object, not {type(sample).__name__}"
            elif not isinstance(sample.get("completion"), str):
                errors[i] = "sample has no string field 'completion'"
            else:
                try:
                    payload.append(json.dumps(sample, allow_nan=False).encode())
                    send.append(i)
                except (TypeError, ValueError) as exc:
                    errors[i] = f"sample is not JSON-serialisable: {exc}"[:500]
        with self._lock:
            if self._closed:
                raise RuntimeError(f"verifier {self.name!r} is closed")
            self.budget.check(self.name)
            started = time.monotonic()
            failure = None
            try:
                if send:
                    results, failure = self._run_batch(payload)
                    for j, (value, error) in enumerate(results):
                        scores[send[j]], errors[send[j]] = value, error
            finally:
                elapsed = time.monotonic() - started
                self.stats.busy_s += elapsed
                self.budget.charge(elapsed, failure)
            self.stats.batches += 1
            self.stats.items += n
            self.stats.errors += sum(e is not None for e in errors)
            self.budget.check(self.name)
        return scores, errors

    def _accept(self, item: list[Any]) -> Result:
        lo, hi = self.config.score_range
        tag = item[1] if len(item) > 1 else None
        if tag == "v" and len(item) == 3:
            v = item[2]
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None, f"{self.entry} returned a malformed result"
            try:  # a frame forged by the verifier's code may hold any JSON number
                v = float(v)
            except OverflowError:
                return None, f"{self.entry} returned a number out of range"
            if math.isnan(v):
                return None, f"{self.entry} returned NaN; expected a finite number"
            if math.isinf(v):
                return None, f"{self.entry} returned {v}; expected a finite number"
            return min(max(v, lo), hi), None
        if tag == "e" and len(item) == 3:
            return None, str(item[2])[:500]
        if tag == "t" and len(item) == 4:
            kind, shown = str(item[2])[:50], str(item[3])[:100]
            return None, f"{self.entry} returned {kind} ({shown}); expected a finite number"
        raise process.ProtocolError("malformed result")

    def _run_batch(self, payload: list[bytes]) -> tuple[list[Result], str | None]:
        """Send one batch and collect its results; (results, failure or None)."""
        timeout_s = self.config.timeout_s
        wait_s = min(timeout_s, max(self.budget.remaining_s(), 0.0))
        deadline = time.monotonic() + wait_s
        out = bytearray()
        if self._child is None:
            self._child, init = process.spawn(
                self.mode,
                {
                    "source": self.config.source,
                    "entry": self.entry,
                    "limits": self.limits.as_dict(),
                },
                memory_bytes=self.limits.cgroup_bytes,
            )
            self.stats.spawns += 1
            out += init
        child = self._child
        self._batch_id += 1
        b = self._batch_id
        head = json.dumps({"b": b, "timeout_s": timeout_s}).encode()[:-1] + b', "items": ['
        body = head + b", ".join(payload) + b"]}"
        out += len(body).to_bytes(4, "big") + body
        results: list[Result | None] = [None] * len(payload)
        failure: str | None = None
        recycle = False
        try:
            recycle = self._exchange(child, b, memoryview(bytes(out)), deadline, results)
        except TimeoutError:
            self.stats.timeouts += 1
            if wait_s < timeout_s:
                failure = f"timeout: the verifier's time budget ({self.budget.time_s:g}s) ran out"
            else:
                failure = f"timeout after {timeout_s:g}s"
        except EOFError:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=1)  # let bwrap report the child's own exit status
            rc = self._kill()
            self.stats.crashes += 1
            failure = "verifier process died" + process.describe_exit(rc, child.mode)
            if child.oom_killed:
                mib = self.limits.cgroup_bytes / (1 << 20)
                failure += f": out of memory (the sandbox's memory limit is {mib:g} MiB)"
        except _LoadError as exc:
            failure = f"verifier failed to load: {exc}"
        except process.ProtocolError as exc:
            failure = f"verifier protocol violation: {exc}"
        if failure is not None or recycle:
            self._kill()  # the whole sandbox; a fresh one serves the next batch
        return [r if r is not None else (None, failure or "no result") for r in results], failure

    def _exchange(
        self,
        child: process.Child,
        b: int,
        view: memoryview,
        deadline: float,
        results: list[Result | None],
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
                        if self._handle(child, b, obj, results):
                            return bool(obj.get("recycle"))

    def _handle(
        self, child: process.Child, b: int, obj: dict[str, Any], results: list[Result | None]
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
            results[i] = self._accept(item)
        return False
