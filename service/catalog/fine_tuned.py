"""Fine-tuned model names: what a succeeded OpenAI-style fine-tuning job (`jobs.fine_tuning`
set) is called, `ft:{model}:{suffix}:{job}`, and the checkpoint that name stands for (the
job's last). As OpenAI's `ft:gpt-4o-mini:org:suffix:id`; it works wherever a model is named:
chat completions, GET /v1/models, a new job's `model`/`base_model`.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.text import text_problem
from service.models import Checkpoint, Job

PREFIX = "ft:"


def fine_tuned_model_name(job: Job) -> str | None:
    """The job's fine-tuned model, once it has succeeded; None before (and for other jobs)."""
    if not job.fine_tuning or job.status != "succeeded":
        return None
    suffix = job.fine_tuning.get("suffix") or ""
    return f"{PREFIX}{job.fine_tuning['model']}:{suffix}:{job.id.removeprefix('job_')}"


def _final_checkpoint(session: Session, job: Job) -> Checkpoint | None:
    return session.scalar(
        select(Checkpoint)
        .where(Checkpoint.job_id == job.id)
        .order_by(Checkpoint.step.desc())
        .limit(1)
    )


def find_fine_tuned(session: Session, tenant_id: str, name: str) -> tuple[Checkpoint, Job] | None:
    """The checkpoint behind the tenant's fine-tuned model `name`; None exactly as for a
    missing name (another tenant's included)."""
    if not name.startswith(PREFIX) or ":" not in name[len(PREFIX) :] or text_problem(name):
        return None  # (a NUL character: PostgreSQL refuses it in any text parameter)
    job_id = "job_" + name.rsplit(":", 1)[1]
    job = session.scalar(select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id))
    if job is None or fine_tuned_model_name(job) != name:
        return None
    ckpt = _final_checkpoint(session, job)
    return None if ckpt is None else (ckpt, job)


def tenant_fine_tuned(session: Session, tenant_id: str, limit: int) -> list[tuple[Checkpoint, Job]]:
    """The tenant's fine-tuned models (newest job first), each with its final checkpoint, in
    one query."""
    fine_tuned = (
        Job.tenant_id == tenant_id, Job.status == "succeeded", Job.fine_tuning.is_not(None)
    )  # fmt: skip
    last = (
        select(Checkpoint.job_id, func.max(Checkpoint.step).label("step"))
        .join(Job, Job.id == Checkpoint.job_id)
        .where(*fine_tuned)
        .group_by(Checkpoint.job_id)
        .subquery()
    )
    rows = session.execute(
        select(Checkpoint, Job)
        .join(Job, Job.id == Checkpoint.job_id)
        .join(last, (last.c.job_id == Checkpoint.job_id) & (last.c.step == Checkpoint.step))
        .where(*fine_tuned)
        .order_by(Job.id.desc())
        .limit(limit)
    )
    return [(ckpt, job) for ckpt, job in rows]
