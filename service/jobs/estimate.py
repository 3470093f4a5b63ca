"""`POST /v1/jobs/estimate`: the device-seconds and tokens a job spec would take (docs/usage.md).

Work is counted in FLOPs, with N the model's parameters: 2N per sampled completion token, 6N
per trained token (forward and backward), 2N more per trained token of one pass for the
reference model when beta > 0. Seconds are FLOPs over a throughput, and that throughput and the
completion lengths come from the best evidence there is, the newest of:
- `job`: the tenant's last succeeded job on the same model: its recorded usage gives its
  measured FLOP/s (fixed costs such as loading and checkpoints included) and its mean
  completion length as a fraction of its max_new_tokens;
- `preflight`: the tenant's last succeeded pre-flight on the same model: its seconds per step,
  scaled by completions x max_new_tokens per step, and its mean completion length;
- `model_size` when there is neither: every completion max_new_tokens long (an upper bound on
  tokens) at the queue's configured FLOP/s. Small models are bound by the number of operations
  per decoded token, not FLOPs: there this under-estimates the time.
Left out: evaluation, DAPO refills, per-device-count scaling (one device).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.jobs.model_checks import longest_prompt
from service.jobs.schemas import EstimateOut, JobCreate
from service.jobs.service import validate_submission
from service.models import Job, JobUsage, Preflight
from service.settings import Settings
from service.storage import ObjectStorage


@dataclass(frozen=True)
class Shape:
    """What a spec's work is made of, per completion."""

    params: int
    completions: int  # steps x prompts_per_step x group_size
    max_new_tokens: int
    prompt_tokens: int
    passes: int  # num_iterations
    reference: bool  # beta > 0

    def tokens(self, length_fraction: float) -> tuple[int, int]:
        completion = self.completions * self.max_new_tokens * length_fraction
        trained = self.passes * (self.completions * self.prompt_tokens + completion)
        return round(completion), round(trained)

    def flops(self, completion_tokens: float, trained_tokens: float) -> float:
        reference = 2 * trained_tokens / self.passes if self.reference else 0.0
        return self.params * (2 * completion_tokens + 6 * trained_tokens + reference)


def estimate_job(
    session: Session, storage: ObjectStorage, settings: Settings, tenant_id: str, body: JobCreate
) -> EstimateOut:
    submission = validate_submission(session, storage, settings, tenant_id, body)  # the 422s
    model = submission.base.model
    g = body.grpo
    shape = Shape(
        params=model.num_parameters,
        completions=g.steps * g.prompts_per_step * g.group_size,
        max_new_tokens=body.generation.max_new_tokens,
        prompt_tokens=longest_prompt(model, submission.datasets),
        passes=g.num_iterations,
        reference=g.beta > 0,
    )
    job = _last_job(session, tenant_id, model.name)
    preflight = _last_preflight(session, tenant_id, model.name)
    if job is not None and (preflight is None or job[0] >= preflight[0]):
        return _from_job(session, shape, job[1])
    if preflight is not None:
        return _from_preflight(shape, preflight[1], settings.device_flops_for(body.queue))
    completion, trained = shape.tokens(1.0)
    flops = shape.flops(completion, trained)
    device_flops = settings.device_flops_for(body.queue)
    return EstimateOut(
        device_seconds=flops / device_flops, completion_tokens=completion, trained_tokens=trained,
        flops=flops, device_flops=device_flops, basis="model_size",
    )  # fmt: skip


def _last_job(session: Session, tenant_id: str, model: str) -> tuple[datetime, Job] | None:
    job = session.scalar(
        select(Job)
        .where(Job.tenant_id == tenant_id, Job.base_model == model, Job.status == "succeeded")
        .where(Job.id.in_(select(JobUsage.job_id).where(JobUsage.completion_tokens > 0)))
        .order_by(Job.finished_at.desc())
        .limit(1)
    )
    return None if job is None or job.finished_at is None else (job.finished_at, job)


def _last_preflight(
    session: Session, tenant_id: str, model: str
) -> tuple[datetime, Preflight] | None:
    rows = session.scalars(
        select(Preflight)
        .where(Preflight.tenant_id == tenant_id, Preflight.base_model == model)
        .where(Preflight.status == "succeeded")
        .order_by(Preflight.finished_at.desc())
        .limit(5)
    )
    for row in rows:  # the newest with the figures an estimate needs
        result = row.result or {}
        if row.finished_at and result.get("seconds_per_step_estimate") and _per_step(row.spec):
            return row.finished_at, row
    return None


def _per_step(spec: dict) -> float:
    """Completions x max_new_tokens of one step of a stored spec (0 when unreadable)."""
    try:
        g, gen = spec["grpo"], spec["generation"]
        return float(g["prompts_per_step"] * g["group_size"] * gen["max_new_tokens"])
    except (KeyError, TypeError):
        return 0.0


def _from_job(session: Session, shape: Shape, job: Job) -> EstimateOut:
    used = session.execute(
        select(
            func.sum(JobUsage.device_seconds),
            func.sum(JobUsage.completion_tokens),
            func.sum(JobUsage.trained_tokens),
        ).where(JobUsage.job_id == job.id)
    ).one()
    seconds, completion, trained = float(used[0] or 0), float(used[1]), float(used[2] or 0)
    spec = job.spec or {}
    g = spec.get("grpo", {})
    old = Shape(
        params=shape.params,
        completions=job.total_steps * g.get("prompts_per_step", 1) * g.get("group_size", 1),
        max_new_tokens=spec.get("generation", {}).get("max_new_tokens", shape.max_new_tokens),
        prompt_tokens=0,
        passes=g.get("num_iterations", 1),
        reference=g.get("beta", 0.0) > 0,
    )
    # Evaluation and refills count in its tokens too: at most every completion at full length.
    fraction = min(1.0, completion / max(1, old.completions * old.max_new_tokens))
    device_flops = old.flops(completion, trained) / max(seconds, 1e-9)
    new_completion, new_trained = shape.tokens(fraction)
    flops = shape.flops(new_completion, new_trained)
    return EstimateOut(
        device_seconds=flops / device_flops, completion_tokens=new_completion,
        trained_tokens=new_trained, flops=flops, device_flops=device_flops, basis="job",
        basis_id=job.id,
    )  # fmt: skip


def _from_preflight(shape: Shape, preflight: Preflight, configured: float) -> EstimateOut:
    result = preflight.result or {}
    length = float(result.get("completion_len_mean") or shape.max_new_tokens)
    fraction = min(1.0, length / shape.max_new_tokens)
    completion, trained = shape.tokens(fraction)
    # The spec's work in pre-flight-sized steps (completions x max_new_tokens each)
    preflight_steps = shape.completions * shape.max_new_tokens / _per_step(preflight.spec)
    seconds = float(result["seconds_per_step_estimate"]) * preflight_steps
    flops = shape.flops(completion, trained)
    return EstimateOut(
        device_seconds=seconds, completion_tokens=completion, trained_tokens=trained, flops=flops,
        device_flops=flops / seconds if seconds > 0 else configured, basis="preflight",
        basis_id=preflight.id,
    )  # fmt: skip
