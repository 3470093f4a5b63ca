"""What a run's steps use, recorded with each step (docs/usage.md).

Each step adds, to the job's row of the day (UTC) and device kind: the wall-clock seconds since
the previous step boundary of this attempt (the claim, for its first step) times the devices
it holds; the completion tokens sampled (refills and evaluation included); the tokens trained;
and the verifier CPU-seconds. It is written in the step's own fenced transaction, so a run that
lost its lease records nothing. A step redone after a resume adds its device and verifier time
again (they were spent again) but no tokens (the step was counted once already).

Verifier CPU-seconds: the CPU time the training process's child processes (the built-in
verifiers' helper, the python sandboxes, and their children) used while a verifier scored, plus
the scoring thread's own CPU time; children are read in /proc, those that exited and were
reaped through getrusage(RUSAGE_CHILDREN).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.jobs import lifecycle, pausing, run_writes
from service.models import Job, JobMetric, JobUsage
from service.models.base import utcnow
from service.process_group import descendants

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class StepUsage:
    device_kind: str
    device_seconds: float
    completion_tokens: int
    trained_tokens: int
    verifier_cpu_seconds: float


def children_cpu_seconds() -> float:
    """CPU seconds of this thread, of every live descendant process (with their reaped
    children) and of the reaped children of this process."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = time.thread_time() + reaped.ru_utime + reaped.ru_stime
    for pid in descendants(os.getpid()):
        try:  # fields after the command's closing parenthesis, from field 3 (state) on
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended meanwhile: its time is in its parent's reaped-children total
        total += sum(int(v) for v in fields[11:15]) / _TICKS  # utime stime cutime cstime
    return total


class UsageMeter:
    """The usage of one attempt between step boundaries, taken at each recorded step."""

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._verifier_cpu = 0.0
        self._lock = threading.Lock()
        self._kind: str | None = None

    @property
    def device_kind(self) -> str:
        if self._kind is None:
            from workers.grpo.device import device_kind  # torch: the training process only

            self._kind = device_kind()
        return self._kind

    def add_verifier_cpu(self, seconds: float) -> None:
        with self._lock:
            self._verifier_cpu += max(0.0, seconds)

    def metered(self, scorers: list[Any]) -> list[MeteredScorer]:
        return [MeteredScorer(s, self) for s in scorers]

    def take(self, metrics: dict[str, float]) -> StepUsage:
        """This step's usage; the meter starts over for the next one."""
        now = time.monotonic()
        with self._lock:
            elapsed, self._since = now - self._since, now
            cpu, self._verifier_cpu = self._verifier_cpu, 0.0
        tokens = metrics.get("completion_tokens", 0.0) + metrics.get("eval_completion_tokens", 0.0)
        return StepUsage(
            device_kind=self.device_kind,
            device_seconds=elapsed * metrics.get("world_size", 1.0),
            completion_tokens=round(tokens),
            trained_tokens=round(metrics.get("trained_tokens", 0.0)),
            verifier_cpu_seconds=cpu,
        )


class MeteredScorer:
    """A scorer (the engine's protocol: name, weight, score) whose CPU time is metered."""

    def __init__(self, inner: Any, meter: UsageMeter) -> None:
        self.inner, self.meter = inner, meter
        self.name, self.weight = inner.name, inner.weight

    def score(self, samples: list[dict[str, Any]]) -> tuple[list[float | None], list[str | None]]:
        before = children_cpu_seconds()
        try:
            return self.inner.score(samples)
        finally:
            self.meter.add_verifier_cpu(children_cpu_seconds() - before)


def record_step_usage(
    session: Session, job_id: str, epoch: int, step: int, metrics: dict, usage: StepUsage
) -> None:
    """The step's metrics (`run_writes.record_step`) and its usage, in one fenced transaction;
    then the tenant's budget is checked (over it, the job is asked to pause)."""
    lifecycle.fence(session, job_id, epoch)
    earlier = session.scalar(
        select(JobMetric.epoch).where(JobMetric.job_id == job_id, JobMetric.step == step)
    )
    run_writes.record_step(session, job_id, epoch, step, metrics)
    if earlier == epoch:
        return  # our own write, committed before a retry of this transaction: counted once
    redone = earlier is not None  # an earlier attempt recorded this step: its tokens counted
    tenant_id = session.scalar(select(Job.tenant_id).where(Job.id == job_id))
    assert tenant_id is not None  # fenced: the job exists
    key = (job_id, utcnow().date(), usage.device_kind)
    row = session.get(JobUsage, key)
    if row is None:  # no race: the fence holds the job's row until the commit
        row = JobUsage(
            job_id=job_id, day=key[1], device_kind=key[2], tenant_id=tenant_id, steps=0,
            device_seconds=0.0, completion_tokens=0, trained_tokens=0, verifier_cpu_seconds=0.0,
        )  # fmt: skip
        session.add(row)
    row.steps += 1
    row.device_seconds += usage.device_seconds
    row.verifier_cpu_seconds += usage.verifier_cpu_seconds
    if not redone:
        row.completion_tokens += usage.completion_tokens
        row.trained_tokens += usage.trained_tokens
    session.flush()
    pausing.pause_if_over_budget(session, job_id, tenant_id)
