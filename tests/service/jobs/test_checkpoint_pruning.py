"""`keep_checkpoints` on the service side, on both databases: the fenced pruning of rows, the
runner deleting their archives and its local copies, and a job whose final checkpoint is
already stored finishing without training again."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.ids import new_id
from service.jobs import lifecycle, run_writes
from service.models import Checkpoint, Job, JobEvent, JobMetric
from service.models.base import utcnow
from service.settings import Settings
from service.storage import LocalStorage
from service.training import resume, runner
from tests.service.jobs.test_lifecycle import make_job


def running_job(
    sessions: sessionmaker[Session], total_steps: int, spec: dict[str, Any] | None = None
) -> tuple[str, int]:
    """A claimed job: (id, epoch)."""
    job_id = make_job(sessions)
    with sessions.begin() as s:
        values = {"total_steps": total_steps, "spec": spec or {}}
        s.execute(update(Job).where(Job.id == job_id).values(**values))
        epoch = lifecycle.claim(s, job_id, 60)
    assert epoch is not None
    return job_id, epoch


def checkpoint(job_id: str, step: int, epoch: int) -> Checkpoint:
    return Checkpoint(
        id=new_id("ckpt"), job_id=job_id, step=step, epoch=epoch,
        object_key=f"jobs/{job_id}/e{epoch}/step-{step}.tar", size_bytes=1, sha256="0" * 64,
        format="full",
    )  # fmt: skip


def add_checkpoints(
    sessions: sessionmaker[Session], job_id: str, epoch: int, steps: list[int]
) -> dict[int, Checkpoint]:
    rows = {step: checkpoint(job_id, step, epoch) for step in steps}
    for row in rows.values():
        with sessions.begin() as s:
            run_writes.record_checkpoint(s, job_id, epoch, row)
    return rows


def stored_steps(sessions: sessionmaker[Session], job_id: str) -> list[int]:
    with sessions.begin() as s:
        query = select(Checkpoint.step).where(Checkpoint.job_id == job_id)
        return sorted(s.scalars(query))


def test_prune_keeps_the_newest_n_periodic_and_the_final(
    sessions: sessionmaker[Session],
) -> None:
    job_id, epoch = running_job(sessions, total_steps=6)
    rows = add_checkpoints(sessions, job_id, epoch, [1, 2, 3, 4, 6])
    with sessions.begin() as s:
        keys = run_writes.prune_checkpoints(s, job_id, epoch, 2, 6)
    assert sorted(keys) == sorted(rows[step].object_key for step in (1, 2))
    assert stored_steps(sessions, job_id) == [3, 4, 6]
    with sessions.begin() as s:
        assert run_writes.prune_checkpoints(s, job_id, epoch, 2, 6) == []  # nothing more
        assert run_writes.prune_checkpoints(s, job_id, epoch, 1, 6) == [rows[3].object_key]
        events = s.scalars(select(JobEvent).where(JobEvent.type == "checkpoints_pruned")).all()
    assert [e.data["steps"] for e in events if e.job_id == job_id] == [[1, 2], [3]]
    assert stored_steps(sessions, job_id) == [4, 6]  # the final step's never counts


def test_prune_spares_a_checkpoint_a_live_job_starts_from(
    sessions: sessionmaker[Session],
) -> None:
    job_id, epoch = running_job(sessions, total_steps=9)
    rows = add_checkpoints(sessions, job_id, epoch, [1, 2, 3])
    with sessions.begin() as s:
        keys = run_writes.prune_checkpoints(
            s, job_id, epoch, 1, 9, lambda _s, ident: ident == rows[1].id
        )
    assert keys == [rows[2].object_key]
    assert stored_steps(sessions, job_id) == [1, 3]


def test_prune_is_fenced(sessions: sessionmaker[Session]) -> None:
    job_id, epoch = running_job(sessions, total_steps=6)
    add_checkpoints(sessions, job_id, epoch, [1, 2, 3])
    with pytest.raises(lifecycle.LeaseLost), sessions.begin() as s:
        run_writes.prune_checkpoints(s, job_id, epoch + 1, 1, 6)
    assert stored_steps(sessions, job_id) == [1, 2, 3]


@pytest.fixture
def in_process(sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's units of work on the test's database."""

    @contextmanager
    def scope() -> Iterator[Session]:
        with sessions.begin() as session:
            yield session

    monkeypatch.setattr(runner, "session_scope", scope)
    monkeypatch.setattr(resume, "session_scope", scope)


def checkpoint_dir(root: Path, step: int) -> Path:
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"w" * (100 + step))
    return directory


class DeleteFails(LocalStorage):
    def delete(self, key: str) -> None:
        raise ConnectionError("storage unreachable")


def job_run(
    sessions: sessionmaker[Session], job_id: str, epoch: int, storage: LocalStorage
) -> runner.JobRun:
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
    return runner.JobRun(job, epoch, Settings(lease_seconds=60), storage)


@pytest.mark.usefixtures("in_process")
def test_on_checkpoint_prunes_rows_objects_and_local_copies(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    job_id, epoch = running_job(sessions, total_steps=4, spec={"keep_checkpoints": 1})
    storage = LocalStorage(tmp_path / "objects")
    run = job_run(sessions, job_id, epoch, storage)
    dirs = [checkpoint_dir(tmp_path / "work", step) for step in (1, 2, 3, 4)]
    for step, directory in enumerate(dirs, 1):
        run.on_checkpoint(step, directory)
    assert stored_steps(sessions, job_id) == [3, 4]
    prefix = tmp_path / "objects" / "tenants"
    assert sorted(p.name for p in prefix.rglob("*.tar")) == ["step-3.tar", "step-4.tar"]
    assert [d.exists() for d in dirs] == [False, False, False, True]  # only the newest copy


@pytest.mark.usefixtures("in_process")
def test_pruning_spares_the_base_of_a_live_job(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    job_id, epoch = running_job(sessions, total_steps=4, spec={"keep_checkpoints": 1})
    run = job_run(sessions, job_id, epoch, LocalStorage(tmp_path / "objects"))
    run.on_checkpoint(1, checkpoint_dir(tmp_path, 1))
    with sessions.begin() as s:
        first = s.scalar(select(Checkpoint.id).where(Checkpoint.job_id == job_id))
        owner = s.get(Job, job_id)
        assert owner is not None
        child = Job(
            id=new_id("job"), tenant_id=owner.tenant_id, dataset_id=owner.dataset_id,
            spec={"base_model": first}, total_steps=1,
        )  # fmt: skip
        s.add(child)  # queued: live
    run.on_checkpoint(2, checkpoint_dir(tmp_path, 2))
    run.on_checkpoint(3, checkpoint_dir(tmp_path, 3))
    assert stored_steps(sessions, job_id) == [1, 3]


@pytest.mark.usefixtures("in_process")
def test_a_failed_object_delete_is_logged_not_fatal(
    sessions: sessionmaker[Session], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job_id, epoch = running_job(sessions, total_steps=4, spec={"keep_checkpoints": 1})
    run = job_run(sessions, job_id, epoch, DeleteFails(tmp_path / "objects"))
    with caplog.at_level(logging.WARNING, logger=runner.__name__):
        for step in (1, 2):
            run.on_checkpoint(step, checkpoint_dir(tmp_path, step))
    assert stored_steps(sessions, job_id) == [2]  # the row went; the orphan is logged
    assert any("could not delete checkpoint object" in r.message for r in caplog.records)


@pytest.mark.usefixtures("in_process")
def test_a_job_whose_final_checkpoint_is_stored_finishes_without_training(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """A crash after the final checkpoint's commit, before the job was marked succeeded: the
    next attempt finds nothing to train (and the final checkpoint nothing to resume)."""
    spec = {"base_model": str(tmp_path / "no-model"), "grpo": {"steps": 3}}
    job_id, epoch = running_job(sessions, total_steps=3, spec=spec)
    with sessions.begin() as s:
        run_writes.record_step(s, job_id, epoch, 3, {"reward_mean": 0.5})
    add_checkpoints(sessions, job_id, epoch, [3])
    with sessions.begin() as s:  # the worker died; the reconciler requeues the job
        s.execute(update(Job).where(Job.id == job_id).values(lease_until=utcnow() - timedelta(1)))
        assert [j.id for j in lifecycle.expire(s, 3)] == [job_id]
    runner.run_job(job_id, Settings(data_dir=tmp_path / "data", lease_seconds=60))
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.status, job.epoch, job.error) == ("succeeded", 2, None)
        resumed = s.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.type == "resumed")
        ).all()
        metrics = s.scalars(select(JobMetric.epoch).where(JobMetric.job_id == job_id)).all()
    assert [e.data for e in resumed] == [{"from_step": 3, "redo_steps": 0, "final": True}], (
        "nothing trained"
    )
    assert metrics == [1]
