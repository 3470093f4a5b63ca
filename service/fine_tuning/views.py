"""Our jobs, events and checkpoints in OpenAI's fine-tuning shapes (times in Unix seconds)."""

from __future__ import annotations

import math
from typing import Any

from service.catalog.fine_tuned import fine_tuned_model_name
from service.core.openai_ids import event_id, to_openai
from service.files.schemas import unix
from service.fine_tuning.progress import Progress
from service.fine_tuning.schemas import (
    CheckpointOut,
    FineTuningEventOut,
    FineTuningJobOut,
    JobError,
    SupervisedHyperparameters,
)
from service.models import FINAL_STATUSES, Checkpoint, Job, JobEvent

# Our status -> OpenAI's. `validating_files` never shows: files are validated at upload and at
# creation, before the job exists. A job winding down (cancelling, pausing) is still running.
STATUS = {
    "queued": "queued",
    "running": "running",
    "cancelling": "running",
    "pausing": "running",
    "paused": "paused",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}
_WARNINGS = ("warning", "reward_hacking_suspected", "no_worker", "rollouts_not_stored")
_ERRORS = ("rank_failed",)


def job_view(job: Job, progress: Progress | None = None) -> FineTuningJobOut:
    """`progress` (service.fine_tuning.progress) fills `trained_tokens` and `estimated_finish`."""
    ft = job.fine_tuning or {}
    progress = progress or Progress()
    hp = ft["method"]["reinforcement"]["hyperparameters"]
    error = None
    if job.error:
        error = JobError(code=str(job.error.get("code")), message=str(job.error.get("message")))
    return FineTuningJobOut(
        id=to_openai("job", job.id),
        created_at=unix(job.created_at),
        error=error,
        fine_tuned_model=fine_tuned_model_name(job),
        finished_at=unix(job.finished_at)
        if job.finished_at and job.status in FINAL_STATUSES
        else None,
        hyperparameters=SupervisedHyperparameters(
            batch_size=hp["batch_size"],
            learning_rate_multiplier=hp["learning_rate_multiplier"],
            n_epochs=hp["n_epochs"],
        ),
        model=ft["model"],
        organization_id=job.tenant_id,
        seed=ft["seed"],
        status=STATUS[job.status],
        trained_tokens=progress.trained_tokens,
        training_file=ft["training_file"],
        validation_file=ft.get("validation_file"),
        estimated_finish=progress.estimated_finish,
        metadata=ft.get("metadata"),
        method=ft["method"],
        suffix=ft.get("suffix"),
        job=job.id,
        job_status=job.status,
        step=job.step,
        total_steps=job.total_steps,
    )


def _level(event: JobEvent) -> str:
    if event.type in _ERRORS or (event.data or {}).get("status") == "failed":
        return "error"
    return "warn" if event.type in _WARNINGS else "info"


def event_view(event: JobEvent) -> FineTuningEventOut:
    return FineTuningEventOut(
        id=event_id(event.id),
        created_at=unix(event.at),
        level=_level(event),
        message=event.message,
        data=event.data or None,
        type="metrics" if event.type == "metrics" else "message",
        event_type=event.type,
    )


def checkpoint_view(ckpt: Checkpoint, job: Job, metrics: dict[str, Any] | None) -> CheckpointOut:
    """`metrics`: the step's row of our metrics; OpenAI's `train_loss` is our `loss`."""
    numbers = {
        k: float(v)
        for k, v in (metrics or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    if "loss" in numbers:
        numbers["train_loss"] = numbers["loss"]
    return CheckpointOut(
        id=to_openai("ckpt", ckpt.id),
        created_at=unix(ckpt.created_at),
        fine_tuned_model_checkpoint=ckpt.id,
        fine_tuning_job_id=to_openai("job", job.id),
        metrics={"step": float(ckpt.step), **numbers},
        step_number=ckpt.step,
    )
