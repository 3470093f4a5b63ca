"""Built-in verifier kinds run in a helper process, each batch under a deadline.

Why a process: the built-in kinds are ours, their input is not, and a pathological input can
keep one busy in C code that holds the GIL for seconds (the numeric kind's LaTeX clean-up:
Python `re` backtracking over `\\frac{` followed by spaces, cubic in the spaces; a
json_schema `anyOf` of two `$ref`s over a deeply nested array, doubling per level: figures in
bench/README.md, "Figures behind design choices"). Proving each kind linear would have to be
redone for every kind and every library upgrade; a thread cannot interrupt C code; a process
can be killed. So every built-in batch is sent to a helper (`_builtin_child.py`), whose answer
must come within GRPO_BUILTIN_VERIFIER_TIMEOUT_S (10 s by default, the python kind's default
`timeout_s`). Past it the helper is SIGKILLed: the items it answered keep their scores, the
others get a timeout error, a fresh helper serves the next batch, and the failure is counted;
more than MAX_FAILURES in one job (or /test call) fail it with VerifierBudgetExceeded, like a
python verifier's `max_failures`.

One host (one helper process, started at the first batch) serves every built-in leaf that
`open_verifier` opens in one call (a composite's parts), or all of a job's verifiers when the
caller passes one. The helper dies with the thread that started it (PR_SET_PDEATHSIG), lives
in a session of its own (no signal sent to a process group reaches it) and under a 4 GiB
address-space limit.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .base import BaseVerifier, Sample, ScoreResult
from .budget import VerifierBudgetExceeded

TIMEOUT_ENV = "GRPO_BUILTIN_VERIFIER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0  # a helper that cannot start in this long is a crash, not a timeout
MAX_FAILURES = 10  # batches past the deadline (or crashes) one verifier may have per job
log = logging.getLogger(__name__)


def batch_timeout_s() -> float:
    """GRPO_BUILTIN_VERIFIER_TIMEOUT_S, read when a host is made (the workers import no
    settings)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        log.warning("%s=%r is not a positive number; using %g", TIMEOUT_ENV, raw, DEFAULT_TIMEOUT_S)
        return DEFAULT_TIMEOUT_S
    return value


class _Failed(Exception):
    """The batch did not complete: the helper timed out, died or could not start."""


def _frame(obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    return len(data).to_bytes(4, "big") + data


class _Helper:
    """One running helper process and its pipes."""

    def __init__(self) -> None:
        argv = [sys.executable, "-m", "workers.verifiers._builtin_child", str(os.getpid())]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self.stdin, False)
        os.set_blocking(self.stdout, False)
        self.buf = bytearray()
        self.opened: set[int] = set()
        self.ready = False

    def frames(self) -> list[dict[str, Any]]:
        out = []
        while len(self.buf) >= 4:
            size = int.from_bytes(self.buf[:4], "big")
            if len(self.buf) < 4 + size:
                break
            out.append(json.loads(bytes(self.buf[4 : 4 + size])))
            del self.buf[: 4 + size]
        return out

    def kill(self) -> int | None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        rc = self.proc.wait()  # SIGKILL does not hang
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        return rc


def _describe(rc: int | None) -> str:
    if rc is None:
        return ""
    if rc < 0:
        try:
            return f" (killed by {signal.Signals(-rc).name})"
        except ValueError:
            return f" (killed by signal {-rc})"
    return f" (exit code {rc})"


class BuiltinHost:
    """The helper that scores built-in kinds; registered verifiers survive its restarts."""

    def __init__(self, timeout_s: float | None = None) -> None:
        self.timeout_s = batch_timeout_s() if timeout_s is None else timeout_s
        self._specs: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._batches = itertools.count(1)
        self._helper: _Helper | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.spawns = 0

    def register(self, kind: str, config: dict[str, Any], name: str) -> int:
        key = next(self._ids)
        self._specs[key] = {"op": "open", "id": key, "kind": kind, "config": config, "name": name}
        return key

    def unregister(self, key: int) -> None:
        with self._lock:
            self._specs.pop(key, None)
            helper = self._helper
            if helper is not None and key in helper.opened:
                helper.opened.discard(key)
                try:
                    self._send_close(helper, key)
                except (OSError, _Failed):  # a helper that cannot take a close is not reused
                    self._kill()

    def score(self, key: int, samples: list[Sample]) -> tuple[ScoreResult, str | None]:
        """Scores of one batch and the batch's failure (None when it completed)."""
        n = len(samples)
        scores: list[float | None] = [None] * n
        errors: list[str | None] = [None] * n
        payload: list[bytes] = []
        index: list[int] = []
        for i, sample in enumerate(samples):
            try:
                payload.append(json.dumps(sample).encode())
                index.append(i)
            except (TypeError, ValueError) as exc:
                errors[i] = f"sample is not JSON-serialisable: {exc}"[:500]
        if not payload:
            return (scores, errors), None
        answered: dict[int, tuple[Any, Any]] = {}  # what a timeout keeps
        failure = None
        with self._lock:
            if self._closed:
                raise RuntimeError("the built-in verifier host is closed")
            try:
                self._run(key, payload, answered)
            except _Failed as exc:
                failure = str(exc)
                self._kill()
        stuck = None
        for j, i in enumerate(index):
            if j in answered:
                scores[i], errors[i] = answered[j]
            elif stuck is None:  # the item the helper was on when it timed out or died
                stuck, errors[i] = i, failure
            else:
                errors[i] = f"not scored: item {stuck} of this batch failed first ({failure})"[:500]
        return (scores, errors), failure

    def _run(self, key: int, payload: list[bytes], answered: dict[int, tuple[Any, Any]]) -> None:
        helper = self._start()
        out = b""
        if key not in helper.opened:
            out += _frame(self._specs[key])
            helper.opened.add(key)
        b = next(self._batches)
        body = b'{"op": "score", "id": %d, "b": %d, "items": [' % (key, b)
        body += b", ".join(payload) + b"]}"
        out += len(body).to_bytes(4, "big") + body

        def on_frame(obj: dict[str, Any]) -> bool:
            if obj.get("b") != b:
                raise _Failed("the built-in verifier helper broke protocol")
            if obj.get("done"):
                return True
            j, value, error = obj["r"]
            answered[j] = (value, error)
            return False

        deadline = time.monotonic() + self.timeout_s  # from a started helper: start-up is free
        self._pump(helper, memoryview(out), deadline, on_frame)

    def _start(self) -> _Helper:
        if self._helper is None:
            helper = _Helper()
            self.spawns += 1
            deadline = time.monotonic() + max(START_TIMEOUT_S, self.timeout_s)
            try:
                self._pump(helper, None, deadline, lambda obj: obj.get("ready") is True)
            except _Failed as exc:
                helper.kill()
                raise _Failed(f"the built-in verifier helper did not start: {exc}") from None
            self._helper = helper
        return self._helper

    def _send_close(self, helper: _Helper, key: int) -> None:
        self._pump(helper, memoryview(_frame({"op": "close", "id": key})), time.monotonic() + 1)

    def _pump(
        self,
        helper: _Helper,
        view: memoryview | None,
        deadline: float,
        on_frame: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """Write `view`, and read frames until `on_frame` says done (without one: until all
        is written). Raises _Failed at the deadline or when the helper dies."""
        with selectors.DefaultSelector() as sel:
            if on_frame is not None:
                sel.register(helper.stdout, selectors.EVENT_READ)
            if view:
                sel.register(helper.stdin, selectors.EVENT_WRITE)
            elif on_frame is None:
                return
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _Failed(
                        f"timeout: the batch did not finish within {self.timeout_s:g}s "
                        f"(the built-in kinds' per-batch deadline, {TIMEOUT_ENV})"
                    )
                for event, _ in sel.select(remaining):
                    if event.fd == helper.stdin:
                        assert view is not None
                        try:
                            view = view[os.write(helper.stdin, view[: 1 << 20]) :]
                        except BlockingIOError:
                            continue
                        except OSError:
                            view = view[:0]  # the helper is gone; EOF on its output follows
                        if not view:
                            sel.unregister(helper.stdin)
                            if on_frame is None:
                                return
                        continue
                    try:
                        data = os.read(helper.stdout, 1 << 20)
                    except BlockingIOError:
                        continue
                    if not data:
                        rc = helper.kill()
                        raise _Failed(f"the built-in verifier helper died{_describe(rc)}")
                    helper.buf += data
                    if any(on_frame(obj) for obj in helper.frames()):  # type: ignore[misc]
                        return

    def _kill(self) -> None:
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.kill()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._kill()

    def __del__(self) -> None:
        if sys is not None and getattr(self, "_helper", None) is not None:
            self._kill()


class HostedVerifier(BaseVerifier):
    """A built-in verifier whose batches run on a BuiltinHost."""

    def __init__(
        self, name: str, kind: str, config: dict[str, Any], host: BuiltinHost, *, owns_host: bool
    ) -> None:
        super().__init__(name)
        self.kind, self.host, self.owns_host = kind, host, owns_host
        self._key: int | None = host.register(kind, config, name)
        self.failures = 0
        self.last_failure: str | None = None

    def score(self, samples: list[Sample]) -> ScoreResult:
        if self._key is None:
            raise RuntimeError(f"verifier {self.name!r} is closed")
        result, failure = self.host.score(self._key, samples)
        if failure is not None:
            self.failures += 1
            self.last_failure = failure
            if self.failures > MAX_FAILURES:
                raise VerifierBudgetExceeded(
                    self.name,
                    f"{self.failures} batches of the {self.kind} kind failed (past the "
                    f"{self.host.timeout_s:g}s per-batch deadline, or the helper died), more "
                    f"than {MAX_FAILURES}; last: {failure}",
                )
        return result

    def close(self) -> None:
        key, self._key = self._key, None
        if key is not None:
            self.host.unregister(key)
        if self.owns_host:
            self.host.close()
