"""A run's writes other than its transitions (`lifecycle.py`): a step's metrics, a checkpoint, a
step's rollouts, the pruning of old checkpoints. Each is fenced first (`lifecycle.fence`): a run
that lost its lease writes nothing, and raises LeaseLost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from service.jobs import openai_metrics
from service.jobs.lifecycle import add_event, fence
from service.models import Checkpoint, Job, JobMetric, RolloutFile


def record_step(
    session: Session, job_id: str, epoch: int, step: int, metrics: dict[str, Any]
) -> None:
    fence(session, job_id, epoch)
    session.merge(JobMetric(job_id=job_id, step=step, epoch=epoch, metrics=metrics))
    job = session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(step=step, latest_metrics={"step": step, **metrics})
        .returning(Job.fine_tuning, Job.total_steps)
    ).one()
    if job.fine_tuning is not None:  # OpenAI's clients read a step's metrics as an event
        add_event(
            session,
            job_id,
            "metrics",
            *openai_metrics.metrics_event(step, job.total_steps, metrics),
        )


def record_checkpoint(
    session: Session, job_id: str, epoch: int, checkpoint: Checkpoint
) -> str | None:
    """Point the job at a new, uploaded checkpoint. Returns the object key of the row it
    replaced (the same step, saved by an earlier attempt), for the caller to delete from storage
    once this has committed."""
    fence(session, job_id, epoch)
    existing = session.scalar(
        select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == checkpoint.step)
    )
    replaced = None
    if existing is not None:
        replaced = existing.object_key if existing.object_key != checkpoint.object_key else None
        session.delete(existing)
        session.flush()
    session.add(checkpoint)
    add_event(
        session,
        job_id,
        "checkpoint",
        f"checkpoint at step {checkpoint.step}",
        {"step": checkpoint.step, "sha256": checkpoint.sha256, "size_bytes": checkpoint.size_bytes},
    )
    return replaced


def record_rollouts(session: Session, job_id: str, epoch: int, file: RolloutFile) -> str | None:
    """Point the job at a step's uploaded rollouts (one split). Returns the object key of the row
    it replaced (the same step, redone after a resume), for the caller to delete from storage
    once this has committed. A run that lost its lease raises LeaseLost here and adds nothing."""
    fence(session, job_id, epoch)
    existing = session.scalar(
        select(RolloutFile).where(
            RolloutFile.job_id == job_id,
            RolloutFile.split == file.split,
            RolloutFile.step == file.step,
        )
    )
    replaced = None
    if existing is not None:
        replaced = existing.object_key if existing.object_key != file.object_key else None
        session.delete(existing)
        session.flush()  # the unique (job, split, step) row goes before its successor comes
    session.add(file)
    return replaced


def prune_checkpoints(
    session: Session,
    job_id: str,
    epoch: int,
    keep: int,
    final_step: int,
    in_use: Callable[[Session, str], bool] = lambda _session, _id: False,
) -> list[str]:
    """Delete the job's periodic checkpoint rows beyond the newest `keep` (`keep_checkpoints`,
    as TRL's save_total_limit). Never the final step's, never the latest (the resume point),
    never one that `in_use` says a live job starts from. Returns the deleted rows' object keys,
    for the caller to delete from storage once this has committed."""
    fence(session, job_id, epoch)
    rows = session.scalars(
        select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc())
    ).all()
    if not rows:
        return []
    latest = rows[0]
    periodic = [r for r in rows if r.step != final_step]
    doomed = [
        r for r in periodic[keep:] if r.id != latest.id and not in_use(session, r.id)
    ]  # newest first: periodic[:keep] are the ones kept
    if not doomed:
        return []
    # A Core DELETE: a row the API deleted meanwhile is simply not counted (no stale-row error).
    keys = session.scalars(
        delete(Checkpoint)
        .where(Checkpoint.id.in_([r.id for r in doomed]))
        .returning(Checkpoint.object_key)
        .execution_options(synchronize_session=False)
    ).all()
    steps = sorted(r.step for r in doomed)
    message = f"checkpoints at steps {', '.join(map(str, steps))} deleted (keep_checkpoints {keep})"
    add_event(session, job_id, "checkpoints_pruned", message, {"steps": steps, "keep": keep})
    return list(keys)
