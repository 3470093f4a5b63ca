"""Where an attempt starts: the job's data, and the last committed checkpoint an earlier attempt
left (unpacked, to resume from), or the final one (nothing left to train). A fork with no
checkpoint of its own starts from its fork point, another job's checkpoint, the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select

from service.core.db import session_scope
from service.models import Checkpoint, Dataset, Job
from service.storage import ObjectStorage
from service.storage.archive import extract_tar
from service.training.scorers import records_from_jsonl


class Attempt(Protocol):
    """What of a run (`runner.JobRun`) starting an attempt needs."""

    step: int

    def on_event(self, type_: str, message: str, data: dict[str, Any]) -> None: ...
    def finish(self, status: str, error: dict[str, Any] | None = None) -> None: ...


def records(storage: ObjectStorage, dataset_id: str) -> list[dict[str, Any]]:
    with session_scope() as session:
        dataset = session.get(Dataset, dataset_id)
        if dataset is None:
            raise LookupError(f"dataset {dataset_id} is gone")
        key = dataset.object_key
    return records_from_jsonl(storage.get_bytes(key))


def latest_checkpoint(job_id: str) -> Checkpoint | None:
    """The job's last committed checkpoint (detached), if an earlier attempt left one."""
    with session_scope() as session:
        latest = session.scalar(
            select(Checkpoint)
            .where(Checkpoint.job_id == job_id)
            .order_by(Checkpoint.step.desc())
            .limit(1)
        )
        if latest is not None:
            session.expunge(latest)
    return latest


def start_checkpoint(job: Job) -> Checkpoint | None:
    """The checkpoint this attempt resumes from: the job's own latest, else a fork's fork point
    (its trainer state too: the step numbering goes on from there)."""
    latest = latest_checkpoint(job.id)
    if latest is not None or not job.forked_from:
        return latest
    with session_scope() as session:
        point = session.get(Checkpoint, job.forked_from["checkpoint_id"])
        if point is None:  # kept while the fork is unfinished (checkpoint_in_use): never here
            raise LookupError(f"the fork point {job.forked_from['checkpoint_id']} is gone")
        session.expunge(point)
    return point


def finish_from_final(run: Attempt, final: Checkpoint) -> None:
    """An earlier attempt stored the final checkpoint and died before marking the job done:
    the training is complete (and the final checkpoint has no trainer state to resume)."""
    message = f"the final step-{final.step} checkpoint is already stored: nothing to train"
    run.on_event("resumed", message, {"from_step": final.step, "redo_steps": 0, "final": True})
    run.finish("succeeded")


def resume_point(
    run: Attempt, job: Job, storage: ObjectStorage, work_dir: Path, latest: Checkpoint | None
) -> Path | None:
    """The last committed checkpoint, unpacked, when an earlier attempt left one."""
    if latest is None:
        if job.step > 0:
            message = "no checkpoint yet: starting over"
            run.on_event("resumed", message, {"from_step": 0, "redo_steps": job.step})
        return None
    resume_from, archive = work_dir / "resume", work_dir / "resume.tar"
    work_dir.mkdir(parents=True, exist_ok=True)
    storage.download_file(latest.object_key, archive)
    extract_tar(archive, resume_from)
    redone = max(0, job.step - latest.step)
    message = f"resuming from the step-{latest.step} checkpoint ({redone} step(s) to redo)"
    data: dict[str, Any] = {"from_step": latest.step, "redo_steps": redone}
    if latest.job_id != job.id:
        message = f"starting from the fork point, job {latest.job_id}'s step {latest.step}"
        data["checkpoint_id"] = latest.id
    run.on_event("resumed", message, data)
    run.step = latest.step
    return resume_from
