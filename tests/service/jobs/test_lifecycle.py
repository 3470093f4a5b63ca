"""Claims, fencing and final writes on both databases, as plain functions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.auth.service import get_or_create_tenant
from service.core.ids import new_id
from service.jobs import lifecycle, run_writes
from service.models import Dataset, Job, JobMetric
from service.models.base import utcnow


def make_tenant_and_dataset(sessions: sessionmaker[Session]) -> tuple[str, str]:
    """A new tenant and a dataset of its: (tenant id, dataset id)."""
    with sessions.begin() as s:
        tenant = get_or_create_tenant(s, f"t-{new_id('x')}")
        ds = Dataset(
            id=new_id("ds"), tenant_id=tenant.id, name="d", num_records=1, sha256="0" * 64,
            object_key="k",
        )  # fmt: skip
        s.add(ds)
    return tenant.id, ds.id


def make_job(sessions: sessionmaker[Session]) -> str:
    tenant_id, dataset_id = make_tenant_and_dataset(sessions)
    with sessions.begin() as s:
        job = Job(
            id=new_id("job"), tenant_id=tenant_id, dataset_id=dataset_id, spec={}, total_steps=3
        )
        s.add(job)
    return job.id


def test_only_one_claim_wins(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        first = lifecycle.claim(s, job_id, 60)
    with sessions.begin() as s:
        second = lifecycle.claim(s, job_id, 60)
    assert first == 1 and second is None


def test_expired_lease_is_taken_over_and_fences_the_zombie(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        old = lifecycle.claim(s, job_id, 60)
        run_writes.record_step(s, job_id, old, 1, {"reward_mean": 0.1})
    with sessions.begin() as s:  # the old worker stops heartbeating; its lease runs out
        s.execute(update(Job).where(Job.id == job_id).values(lease_until=utcnow() - timedelta(1)))
    with sessions.begin() as s:
        new = lifecycle.claim(s, job_id, 60)
    assert new == old + 1
    with pytest.raises(lifecycle.LeaseLost), sessions.begin() as s:
        run_writes.record_step(s, job_id, old, 2, {"reward_mean": 9.9})
    with sessions.begin() as s:
        assert not lifecycle.finish(s, job_id, old, "succeeded")
        assert lifecycle.finish(s, job_id, new, "succeeded")
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "succeeded" and job.step == 1
        steps = s.scalars(select(JobMetric.step).where(JobMetric.job_id == job_id)).all()
        assert steps == [1]


def test_finished_job_cannot_be_claimed_or_written(sessions: sessionmaker[Session]) -> None:
    job_id = make_job(sessions)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job_id, 60)
        assert lifecycle.finish(s, job_id, epoch, "failed", {"code": "x", "message": "boom"})
    with sessions.begin() as s:
        assert lifecycle.claim(s, job_id, 60) is None
    with pytest.raises(lifecycle.LeaseLost), sessions.begin() as s:
        lifecycle.fence(s, job_id, epoch)


def test_migrations_downgrade_and_upgrade_again(db_url: str) -> None:
    from service.core.migrate import downgrade, upgrade

    downgrade(db_url)
    upgrade(db_url)
