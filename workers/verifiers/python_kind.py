"""The `python` verifier kind: user code in one long-lived sandboxed child per verifier.

The supervisor side: `sandbox_host.SandboxHost` runs the batches (framed results with a
per-run nonce and item indexes); here each item must be exactly one finite number. A batch
has a wall-clock deadline; the verifier has a per-job time and failure budget (`budget.py`).
On any breach the whole sandbox is SIGKILLed, the failure is counted and a fresh child serves
the next batch.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import process
from .base import BaseVerifier, Sample, ScoreResult
from .budget import Budget
from .config import PythonConfig, analyse_python_source
from .sandbox import require_sandbox
from .sandbox_host import ChildLimits, SandboxHost, SandboxStats

__all__ = ["ChildLimits", "PythonVerifier", "PythonVerifierStats"]

Result = tuple[float | None, str | None]


@dataclass
class PythonVerifierStats(SandboxStats):
    batches: int = 0
    items: int = 0
    errors: int = 0
    busy_s: float = 0.0  # wall-clock time spent in score()


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
        init = {"source": config.source, "entry": self.entry}
        self.host = SandboxHost(self.mode, init, self.limits, what="verifier", stats=self.stats)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def _child(self) -> process.Child | None:
        return self.host.child

    def _kill(self) -> int | None:
        return self.host.kill()

    def close(self) -> None:
        with self._lock:
            self._closed = True
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
        results, failure = self.host.run(
            payload, timeout_s=self.config.timeout_s, budget=self.budget, accept=self._accept
        )
        return [r if r is not None else (None, failure or "no result") for r in results], failure
