"""Per-job budgets of a python verifier: cumulative wall time and sandbox failures.

A per-batch deadline alone lets a verifier that sleeps just under it on every call stretch a
job without bound; the time budget caps the sum. The failure budget stops a job whose verifier
keeps timing out, crashing or breaking protocol, instead of training on zeros.
"""

from __future__ import annotations

from dataclasses import dataclass


class VerifierBudgetExceeded(RuntimeError):  # noqa: N818 - the name is the public contract
    """A verifier spent its per-job budget; the job must fail with this message."""

    def __init__(self, verifier: str, cause: str):
        self.verifier = verifier
        self.cause = cause
        super().__init__(f"verifier {verifier!r} exceeded its budget: {cause}")


@dataclass
class Budget:
    """What one verifier may still spend in this job (or this /test call)."""

    time_s: float
    max_failures: int
    used_s: float = 0.0
    failures: int = 0
    last_failure: str | None = None

    def remaining_s(self) -> float:
        return self.time_s - self.used_s

    def charge(self, seconds: float, failure: str | None) -> None:
        self.used_s += seconds
        if failure is not None:
            self.failures += 1
            self.last_failure = failure

    def check(self, name: str) -> None:
        """Raise VerifierBudgetExceeded when either budget is spent."""
        if self.used_s >= self.time_s:
            raise VerifierBudgetExceeded(
                name,
                f"{self.used_s:.1f}s of wall time used, over the job budget of "
                f"{self.time_s:g}s (budget_s)",
            )
        if self.failures > self.max_failures:
            raise VerifierBudgetExceeded(
                name,
                f"{self.failures} sandbox failures (timeouts, crashes, protocol violations), "
                f"more than max_failures={self.max_failures}; last: {self.last_failure}",
            )
