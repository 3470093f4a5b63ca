"""The tenant's lock and the count under it (`service.jobs.open_jobs.lock_and_count`), on both
databases: a count that waited for the lock sees the job its holder committed."""

from __future__ import annotations

import threading
import time

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.core.ids import new_id
from service.jobs import open_jobs
from service.models import Job, Tenant
from tests.service.jobs.test_lifecycle import make_tenant_and_dataset


def add_job(session: Session, tenant_id: str, dataset_id: str, status: str = "queued") -> None:
    job = Job(
        id=new_id("job"), tenant_id=tenant_id, dataset_id=dataset_id, spec={}, total_steps=3,
        status=status,
    )  # fmt: skip
    session.add(job)
    session.flush()


def test_a_count_that_waited_for_the_lock_sees_the_holders_job(
    sessions: sessionmaker[Session],
) -> None:
    tenant_id, dataset_id = make_tenant_and_dataset(sessions)
    holder = sessions()
    add_job(holder, tenant_id, dataset_id)
    assert open_jobs.lock_and_count(holder, tenant_id, 10) == (None, 1)
    seen: list[int] = []

    def second_submission() -> None:
        with sessions() as s:
            add_job(s, tenant_id, dataset_id)
            seen.append(open_jobs.lock_and_count(s, tenant_id, 10)[1])
            s.rollback()

    waiter = threading.Thread(target=second_submission)
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and not seen  # queued behind the holder's lock
    holder.commit()
    holder.close()
    waiter.join(20)
    assert seen == [2]  # its own job and the one committed while it waited


def test_the_count_stops_at_up_to_and_skips_finished_jobs_and_the_budget_is_read(
    sessions: sessionmaker[Session],
) -> None:
    tenant_id, dataset_id = make_tenant_and_dataset(sessions)
    with sessions.begin() as s:
        s.execute(update(Tenant).where(Tenant.id == tenant_id).values(budget_device_hours=2.5))
        for status in ("queued", "running", "pausing", "succeeded", "failed", "paused"):
            add_job(s, tenant_id, dataset_id, status)
    with sessions() as s:
        assert open_jobs.lock_and_count(s, tenant_id, 10) == (2.5, 3)
        s.rollback()
    with sessions() as s:
        assert open_jobs.lock_and_count(s, tenant_id, 2) == (2.5, 2)
        s.rollback()
