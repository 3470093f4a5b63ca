"""The rollout store's writes on both databases: fenced rows, zombies, redone steps, storage
failures and the quota, as plain functions (the whole path runs in tests/e2e/test_rollouts.py)."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.ids import new_id
from service.core.quotas import rollout_bytes_fit
from service.jobs import lifecycle, run_writes
from service.models import Job, RolloutFile
from service.models.base import utcnow
from service.settings import Settings
from service.storage import LocalStorage
from service.training.rollout_store import RolloutWriter, pick_rows, rollout_key
from tests.service.jobs.test_lifecycle import make_job


def rows(step: int, n: int = 4) -> list[dict[str, Any]]:
    return [
        {"step": step, "split": "train", "group": i // 2, "index": i % 2, "record": i,
         "prompt": "p", "messages": None, "completion": f"c{i}", "reward": float(i),
         "scores": {"v": float(i)}, "advantage": 0.0, "length": 2, "truncated": False,
         "finish_reason": "stop", "errors": {}}
        for i in range(n)
    ]  # fmt: skip


class BrokenStorage(LocalStorage):
    """Storage that refuses every upload: an outage outside our control."""

    def put_bytes(self, key: str, data: bytes) -> None:
        raise ConnectionError("storage unreachable")


def writer(
    sessions: sessionmaker[Session], job_id: str, epoch: int, storage: LocalStorage,
    policy: str = "all", quota: int = 0,
) -> tuple[RolloutWriter, list[tuple[str, str, dict]]]:  # fmt: skip
    events: list[tuple[str, str, dict]] = []

    def fenced(write: Any, *args: Any) -> Any:  # JobRun._fenced, on the test's database
        with sessions.begin() as s:
            return write(s, job_id, epoch, *args)

    settings = Settings(max_rollout_bytes_per_tenant=quota)
    with sessions.begin() as s:
        tenant = s.get(Job, job_id).tenant_id
    hook = RolloutWriter(job_id, tenant, epoch, policy, 7, storage, settings, fenced,
                         lambda *e: events.append(e), sessions.begin)  # fmt: skip
    return hook, events


def tenant_of(sessions: sessionmaker[Session], job_id: str) -> str:
    with sessions.begin() as s:
        return s.get(Job, job_id).tenant_id


def claimed(sessions: sessionmaker[Session]) -> tuple[str, int]:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
    assert epoch is not None
    return job_id, epoch


def files(sessions: sessionmaker[Session], job_id: str) -> list[tuple[int, int, str]]:
    with sessions.begin() as s:
        q = select(RolloutFile.step, RolloutFile.epoch, RolloutFile.object_key)
        return list(s.execute(q.where(RolloutFile.job_id == job_id).order_by(RolloutFile.step)))


def take_over(sessions: sessionmaker[Session], job_id: str) -> int:
    """The lease of the current run lapses and another run claims the job."""
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(lease_until=utcnow() - timedelta(1)))
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
    assert epoch is not None
    return epoch


def test_a_zombie_record_raises_lease_lost_and_leaves_no_row(sessions) -> None:
    job_id, old = claimed(sessions)
    take_over(sessions, job_id)
    row = RolloutFile(id=new_id("rlf"), job_id=job_id, split="train", step=1, epoch=old,
                      object_key="k", rows=1, size_bytes=1)  # fmt: skip
    with pytest.raises(lifecycle.LeaseLost), sessions.begin() as s:
        run_writes.record_rollouts(s, job_id, old, row)
    assert files(sessions, job_id) == []


def test_the_zombie_writer_deletes_its_object(sessions, tmp_path: Path) -> None:
    job_id, old = claimed(sessions)
    storage = LocalStorage(tmp_path)
    zombie, _ = writer(sessions, job_id, old, storage)
    take_over(sessions, job_id)
    with pytest.raises(lifecycle.LeaseLost):
        zombie(1, "train", rows(1))
    assert files(sessions, job_id) == []
    assert not storage.exists(rollout_key(tenant_of(sessions, job_id), job_id, old, "train", 1))


def test_a_redone_step_replaces_the_row_and_its_object(sessions, tmp_path: Path) -> None:
    job_id, first = claimed(sessions)
    storage = LocalStorage(tmp_path)
    writer(sessions, job_id, first, storage)[0](1, "train", rows(1))
    second = take_over(sessions, job_id)
    writer(sessions, job_id, second, storage)[0](1, "train", rows(1, n=2))  # redone after resume
    (step, epoch, key), = files(sessions, job_id)  # fmt: skip
    assert (step, epoch, key) == (
        1,
        second,
        rollout_key(tenant_of(sessions, job_id), job_id, second, "train", 1),
    )
    assert not storage.exists(rollout_key(tenant_of(sessions, job_id), job_id, first, "train", 1))
    assert pq.read_table(io.BytesIO(storage.get_bytes(key))).num_rows == 2


def test_a_storage_failure_warns_once_and_never_raises(sessions, tmp_path: Path) -> None:
    job_id, epoch = claimed(sessions)
    hook, events = writer(sessions, job_id, epoch, BrokenStorage(tmp_path))
    hook(1, "train", rows(1))
    hook(2, "train", rows(2))
    assert files(sessions, job_id) == []
    assert [e[0] for e in events] == ["rollouts_not_stored"]
    assert "storage unreachable" in events[0][1] and events[0][2] == {"step": 1, "split": "train"}


def test_sample_k_is_k_rows_chosen_by_the_seed() -> None:
    picked = pick_rows(rows(1, n=16), 3, seed=7, step=1, split="train")
    assert len(picked) == 3 and picked == pick_rows(rows(1, n=16), 3, 7, 1, "train")
    assert [r["record"] for r in picked] == sorted(r["record"] for r in picked)
    others = [pick_rows(rows(1, n=16), 3, 7, s, "train") for s in range(2, 6)]
    assert any(o != picked for o in others)  # another step, another choice
    assert pick_rows(rows(1), 10, 7, 1, "train") == rows(1)


def test_the_quota_counts_every_job_of_the_tenant(sessions, tmp_path: Path) -> None:
    job_id, epoch = claimed(sessions)
    with sessions.begin() as s:
        tenant = s.get(Job, job_id).tenant_id
        s.add(RolloutFile(id=new_id("rlf"), job_id=job_id, split="train", step=1, epoch=epoch,
                          object_key="k", rows=1, size_bytes=900))  # fmt: skip
    with sessions.begin() as s:
        assert rollout_bytes_fit(s, Settings(max_rollout_bytes_per_tenant=1000), tenant, 100)
        assert not rollout_bytes_fit(s, Settings(max_rollout_bytes_per_tenant=1000), tenant, 101)
        assert rollout_bytes_fit(s, Settings(max_rollout_bytes_per_tenant=0), tenant, 10**12)
        assert rollout_bytes_fit(s, Settings(max_rollout_bytes_per_tenant=1000), "other", 1000)


def test_past_the_quota_a_step_is_not_stored_and_training_goes_on(sessions, tmp_path) -> None:
    job_id, epoch = claimed(sessions)
    storage = LocalStorage(tmp_path)
    hook, events = writer(sessions, job_id, epoch, storage, quota=1)  # no file fits in a byte
    hook(1, "train", rows(1))
    assert files(sessions, job_id) == [] and not storage.exists(
        rollout_key(tenant_of(sessions, job_id), job_id, epoch, "train", 1)
    )
    assert [e[0] for e in events] == ["rollouts_not_stored"] and "quota" in events[0][1]
    big, _ = writer(sessions, job_id, epoch, storage, quota=10**9)
    big(2, "train", rows(2))
    assert [f[0] for f in files(sessions, job_id)] == [2]
