"""The worker's side of the rollout store: each `on_rollouts` call becomes one Parquet object
and one `rollout_files` row.

Order: encode -> quota -> upload -> fenced insert, so a row only ever points at a stored
object. A run that lost its lease has its insert refused (LeaseLost, raised on to stop the run)
and deletes the object it had just uploaded: nothing of a zombie stays visible. A step redone
after a resume replaces the earlier row; its object goes once the new row has committed.
Storage failures and the quota never fail a job: the step goes unrecorded, the log says why,
and the job gets one `rollouts_not_stored` warning event (per attempt, not per step: a storage
outage would otherwise add an event every step).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.orm import Session

from service.core.db import session_scope
from service.core.ids import new_id
from service.core.quotas import rollout_bytes_fit
from service.jobs import lifecycle, run_writes
from service.models import RolloutFile
from service.rollouts.format import encode_rows
from service.settings import Settings
from service.storage import ObjectStorage

log = logging.getLogger(__name__)

FencedWrite = Callable[..., Any]  # JobRun._fenced: (write, *args) -> what the write returned
EventSink = Callable[[str, str, dict[str, Any]], None]


def rollout_key(tenant_id: str, job_id: str, epoch: int, split: str, step: int) -> str:
    return f"tenants/{tenant_id}/jobs/{job_id}/e{epoch}/rollouts/{split}/step-{step}.parquet"


def sample_size(policy: str) -> int | None:
    """K of `sample:K`; None for `all`. (`none` never reaches the writer.)"""
    return int(policy.split(":", 1)[1]) if policy.startswith("sample:") else None


def pick_rows(rows: list[dict], k: int | None, seed: int, step: int, split: str) -> list[dict]:
    """All rows, or K of them chosen by (seed, split, step): the same job stores the same
    completions whenever a step is redone. Kept in their order (group, index)."""
    if k is None or k >= len(rows):
        return rows
    chosen = random.Random(f"{seed}/{split}/{step}").sample(range(len(rows)), k)
    return [rows[i] for i in sorted(chosen)]


class RolloutWriter:
    """The `on_rollouts` hook of one claimed attempt at a job."""

    def __init__(
        self,
        job_id: str,
        tenant_id: str,
        epoch: int,
        policy: str,
        seed: int,
        storage: ObjectStorage,
        settings: Settings,
        fenced: FencedWrite,
        on_event: EventSink,
        sessions: Callable[[], AbstractContextManager[Session]] = session_scope,
    ) -> None:
        self.job_id, self.tenant_id, self.epoch = job_id, tenant_id, epoch
        self.k, self.seed = sample_size(policy), seed
        self.storage, self.settings = storage, settings
        self.fenced, self.on_event, self.sessions = fenced, on_event, sessions
        self.warned = False

    def __call__(self, step: int, split: str, rows: list[dict]) -> None:
        rows = pick_rows(rows, self.k, self.seed, step, split)
        if not rows:
            return
        try:
            data = encode_rows(rows)
        except Exception as exc:  # a record's content Parquet cannot hold: skip, never fail
            log.warning("job %s: rollouts of %s step %d not encoded", self.job_id, split, step,
                        exc_info=True)  # fmt: skip
            self._warn(step, split, f"encoding failed: {exc}"[:500])
            return
        if not self._fits(len(data)):
            limit = self.settings.max_rollout_bytes_per_tenant
            self._warn(step, split, f"the tenant's rollouts would pass its quota ({limit} bytes)")
            return
        key = rollout_key(self.tenant_id, self.job_id, self.epoch, split, step)
        try:
            self.storage.put_bytes(key, data)
        except Exception as exc:
            log.warning("job %s: rollouts of %s step %d not stored", self.job_id, split, step,
                        exc_info=True)  # fmt: skip
            self._warn(step, split, f"storage failed: {exc}"[:500])
            return
        row = RolloutFile(
            id=new_id("rlf"), job_id=self.job_id, split=split, step=step, epoch=self.epoch,
            object_key=key, rows=len(rows), size_bytes=len(data),
        )  # fmt: skip
        try:
            replaced = self.fenced(run_writes.record_rollouts, row)
        except lifecycle.LeaseLost:
            self._delete(key)  # no row points at it: invisible, and now gone
            raise
        if replaced:
            self._delete(replaced)

    def _fits(self, size: int) -> bool:
        if not self.settings.max_rollout_bytes_per_tenant:
            return True
        with self.sessions() as session:
            return rollout_bytes_fit(session, self.settings, self.tenant_id, size)

    def _warn(self, step: int, split: str, reason: str) -> None:
        if self.warned:
            return
        self.warned = True
        message = f"rollouts of {split} step {step} not stored ({reason}); training goes on"
        self.on_event("rollouts_not_stored", message, {"step": step, "split": split})

    def _delete(self, key: str) -> None:
        try:
            self.storage.delete(key)
        except Exception:  # an orphan object, never a row without its object
            log.warning("could not delete rollout object %s", key, exc_info=True)
