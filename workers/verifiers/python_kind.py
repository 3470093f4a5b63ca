"""The `python` verifier kind: user code in one long-lived, isolated child process.

The child runs the trusted `_bootstrap.py` (by file path, `python -I -S -B`) with a cleared
environment, a fresh temporary cwd, its own session (process group), and rlimits applied by the
bootstrap before any user code loads. Batches go in over stdin, results come back over a
dedicated pipe as framed JSON carrying a per-run random nonce and the item index. The child's
stdout and stderr are /dev/null, so nothing the user code prints can pose as a result.

The launch command is built by `_sandbox_command()` alone, so that a later hardening step can
wrap it (bubblewrap, seccomp) without touching the protocol.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import BaseVerifier, Sample, ScoreResult
from .config import PythonConfig, analyse_python_source

BOOTSTRAP_PATH = Path(__file__).with_name("_bootstrap.py")
MAX_RESULT_FRAME = 64 * 1024
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class ChildLimits:
    """rlimits the bootstrap applies before the user code loads."""

    memory_bytes: int = 1 << 30  # RLIMIT_AS
    file_bytes: int = 1 << 20  # RLIMIT_FSIZE
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int | None = 1  # RLIMIT_NPROC (per uid; no effect as root)
    cpu_s: int | None = 3600  # RLIMIT_CPU hard cap over the child's life; per-batch soft cap

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory_bytes": self.memory_bytes,
            "file_bytes": self.file_bytes,
            "open_files": self.open_files,
            "processes": self.processes,
            "cpu_s": self.cpu_s,
        }


def _sandbox_command(
    *, python: str, bootstrap: Path, result_fd: int, workdir: str
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start the verifier child.

    Today: an isolated interpreter (-I: no PYTHON* env vars, no user site, no script dir on
    sys.path; -S: no site-packages; -B: no .pyc writes). Later: wrap this in bwrap
    (--unshare-all --die-with-parent --new-session --cap-drop ALL, read-only binds of the
    Python runtime, tmpfs /tmp, `workdir` as the only writable bind) plus seccomp.
    """
    del workdir  # becomes a bind mount once sandboxed; today it is just the cwd
    argv = [python, "-I", "-S", "-B", str(bootstrap), str(result_fd)]
    return argv, dict(CHILD_ENV)


def _frame(obj: Any) -> bytes:
    data = json.dumps(obj, allow_nan=False).encode()
    return len(data).to_bytes(4, "big") + data


class _ProtocolError(Exception):
    pass


@dataclass
class _Child:
    proc: subprocess.Popen
    result_fd: int
    workdir: str
    nonce: str
    ready: bool = False
    buf: bytearray = field(default_factory=bytearray)


@dataclass
class PythonVerifierStats:
    batches: int = 0
    items: int = 0
    errors: int = 0
    timeouts: int = 0
    crashes: int = 0
    spawns: int = 0
    busy_s: float = 0.0  # wall-clock time spent in score(); for a per-job budget


class PythonVerifier(BaseVerifier):
    def __init__(
        self,
        name: str,
        config: PythonConfig,
        *,
        limits: ChildLimits | None = None,
        python: str | None = None,
    ):
        super().__init__(name)
        self.config = config
        self.entry = analyse_python_source(config.source)
        self.limits = limits or ChildLimits()
        self.python = python or sys.executable
        self.stats = PythonVerifierStats()
        self._child: _Child | None = None
        self._batch_id = 0
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self) -> tuple[_Child, bytes]:
        workdir = tempfile.mkdtemp(prefix="grpo-verifier-")
        r, w = os.pipe()
        try:
            argv, env = _sandbox_command(
                python=self.python, bootstrap=BOOTSTRAP_PATH, result_fd=w, workdir=workdir
            )
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(w,),
                env=env,
                cwd=workdir,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(r)
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        finally:
            os.close(w)
        os.set_blocking(r, False)
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)
        nonce = secrets.token_hex(16)
        init = {
            "nonce": nonce,
            "source": self.config.source,
            "entry": self.entry,
            "limits": self.limits.as_dict(),
        }
        self.stats.spawns += 1
        return _Child(proc=proc, result_fd=r, workdir=workdir, nonce=nonce), _frame(init)

    def _kill(self) -> int | None:
        """Kill the child's whole process group and reap it; returns its exit status."""
        child, self._child = self._child, None
        if child is None:
            return None
        proc = child.proc
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
        shutil.rmtree(child.workdir, ignore_errors=True)
        return rc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._kill()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._kill()

    # ------------------------------------------------------------------ scoring

    def score(self, samples: list[Sample]) -> ScoreResult:
        n = len(samples)
        scores: list[float | None] = [None] * n
        errors: list[str | None] = [None] * n
        if n == 0:
            return scores, errors
        # Serialise each sample on its own so one bad record cannot sink the batch.
        send: list[int] = []
        payload: list[bytes] = []
        for i, sample in enumerate(samples):
            if not isinstance(sample, dict):
                errors[i] = f"sample must be an object, not {type(sample).__name__}"
                continue
            if not isinstance(sample.get("completion"), str):
                errors[i] = "sample has no string field 'completion'"
                continue
            try:
                payload.append(json.dumps(sample, allow_nan=False).encode())
            except (TypeError, ValueError) as exc:
                errors[i] = f"sample is not JSON-serialisable: {exc}"[:500]
                continue
            send.append(i)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"verifier {self.name!r} is closed")
            started = time.monotonic()
            try:
                if send:
                    results = self._run_batch(payload)
                    for j, (value, error) in enumerate(results):
                        scores[send[j]], errors[send[j]] = value, error
            finally:
                self.stats.busy_s += time.monotonic() - started
            self.stats.batches += 1
            self.stats.items += n
            self.stats.errors += sum(e is not None for e in errors)
        return scores, errors

    def _accept(self, frame: dict[str, Any]) -> tuple[float | None, str | None]:
        lo, hi = self.config.score_range
        if "e" in frame:
            return None, str(frame["e"])[:500]
        if "v" in frame:
            v = frame["v"]
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None, f"{self.entry} returned a malformed result"
            if math.isnan(v):
                return None, f"{self.entry} returned NaN; expected a finite number"
            if math.isinf(v):
                return None, f"{self.entry} returned {v}; expected a finite number"
            return min(max(float(v), lo), hi), None
        kind = str(frame.get("t", "?"))[:50]
        shown = str(frame.get("r", ""))[:100]
        return None, f"{self.entry} returned {kind} ({shown}); expected a finite number"

    def _run_batch(self, payload: list[bytes]) -> list[tuple[float | None, str | None]]:
        timeout_s = self.config.timeout_s
        deadline = time.monotonic() + timeout_s
        out = bytearray()
        if self._child is None:
            self._child, init = self._spawn()
            out += init
        child = self._child
        self._batch_id += 1
        b = self._batch_id
        head = json.dumps({"b": b, "timeout_s": timeout_s}).encode()[:-1] + b', "items": ['
        body = head + b", ".join(payload) + b"]}"
        out += len(body).to_bytes(4, "big") + body

        total = len(payload)
        results: list[tuple[float | None, str | None] | None] = [None] * total
        failure: str | None = None
        recycle = False
        stdin_fd = child.proc.stdin.fileno()  # type: ignore[union-attr]
        sel = selectors.DefaultSelector()
        sel.register(child.result_fd, selectors.EVENT_READ)
        if out:
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        view = memoryview(bytes(out))
        done = False
        try:
            while not done:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    failure = f"timeout after {timeout_s:g}s"
                    self.stats.timeouts += 1
                    break
                for key, _ in sel.select(remaining):
                    if key.fd == stdin_fd:
                        try:
                            sent = os.write(stdin_fd, view[:65536])
                        except BlockingIOError:
                            continue
                        except OSError:
                            sel.unregister(stdin_fd)  # the child is gone; EOF follows
                            continue
                        view = view[sent:]
                        if not view:
                            sel.unregister(stdin_fd)
                        continue
                    try:
                        data = os.read(child.result_fd, 65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        raise EOFError
                    child.buf += data
                    for frame in self._frames(child):
                        if self._handle(child, b, frame, results):
                            done = True
                            recycle = bool(frame.get("recycle"))
                            break
                    if done:
                        break
        except EOFError:
            rc = self._kill()
            self.stats.crashes += 1
            failure = "verifier process died" + _describe_exit(rc)
        except _LoadError as exc:
            self._kill()
            failure = f"verifier failed to load: {exc}"
        except _ProtocolError as exc:
            self._kill()
            failure = f"verifier protocol violation: {exc}"
        finally:
            sel.close()
        if failure is not None:
            self._kill()  # no-op if already dead; otherwise kills the whole group
        elif recycle:
            self._kill()  # CPU budget nearly spent: respawn fresh next batch
        return [r if r is not None else (None, failure or "no result") for r in results]

    def _frames(self, child: _Child):
        buf = child.buf
        while len(buf) >= 4:
            size = int.from_bytes(buf[:4], "big")
            if size > MAX_RESULT_FRAME:
                raise _ProtocolError("oversized frame")
            if len(buf) < 4 + size:
                return
            raw = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            try:
                frame = json.loads(raw)
            except ValueError:
                raise _ProtocolError("malformed frame") from None
            if not isinstance(frame, dict) or frame.get("n") != child.nonce:
                raise _ProtocolError("frame without the run's nonce")
            yield frame

    def _handle(
        self,
        child: _Child,
        b: int,
        frame: dict[str, Any],
        results: list[tuple[float | None, str | None] | None],
    ) -> bool:
        """Apply one frame; True when the batch is complete."""
        if not child.ready:
            if "load_error" in frame:
                raise _LoadError(str(frame["load_error"])[:500])
            if frame.get("ready") is True:
                child.ready = True
                return False
            raise _ProtocolError("expected a ready frame")
        if frame.get("b") != b:
            raise _ProtocolError("frame for another batch")
        if frame.get("done") is True:
            if any(r is None for r in results):
                raise _ProtocolError("batch ended with items unanswered")
            return True
        i = frame.get("i")
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(results):
            raise _ProtocolError("bad item index")
        if results[i] is not None:
            raise _ProtocolError(f"second result for item {i}")
        results[i] = self._accept(frame)
        return False


class _LoadError(Exception):
    pass


def _describe_exit(rc: int | None) -> str:
    if rc is None:
        return ""
    if rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = str(-rc)
        extra = " (CPU time limit)" if sig == "SIGXCPU" else ""
        return f" (killed by {sig}{extra})"
    return f" (exit code {rc})"
