"""A job's queue at submission, read from the live workers' registry
(`service.queues.worker_registry`): a job sent to a declared queue that no live worker serves
would wait forever without a word, so it gets a `no_worker` warning event (it is still
accepted: a worker may be on its way, as in an autoscaled pool). A job asking for more devices
than any live worker of its queue owns (`--devices N`) is refused (`check_devices`, a 422
naming the queue's capacity); a queue with no live worker at all accepts it, with the warning.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.core.problems import FieldError
from service.jobs import lifecycle
from service.jobs.schemas import JobCreate
from service.models import Job
from service.queues import worker_registry
from service.settings import Settings
from workers.grpo.world import WorldSizeError, check_world


def check_devices(session: Session, body: JobCreate, settings: Settings) -> list[FieldError]:
    """`resources.devices` the batch splits across, and no more than the queue's live workers
    own (a queue nobody serves yet accepts any: a worker may be on its way)."""
    devices, path = body.resources.devices, "$.resources.devices"
    rollout = body.resources.rollout_devices
    if rollout and not body.grpo.max_off_policy_steps:
        message = (
            "rollout devices generate rollouts ahead of training: set "
            "grpo.max_off_policy_steps to 1 or more, or rollout_devices to 0"
        )
        return [FieldError(path="$.resources.rollout_devices", message=message)]
    if rollout and devices != rollout + 1:
        message = (
            f"rollouts generated ahead train on one device: resources.devices must be "
            f"rollout_devices + 1 = {rollout + 1}, not {devices}"
        )
        return [FieldError(path=path, message=message)]
    try:
        check_world(body, devices - rollout, knob="resources.devices")
    except WorldSizeError as exc:
        return [FieldError(path=path, message=str(exc))]
    capacity = (
        worker_registry.queue_capacity(session, body.queue, settings) if devices > 1 else None
    )
    if capacity is None or devices <= capacity:
        return []
    message = (
        f"{devices} devices asked, but the live workers of queue '{body.queue}' own at most "
        f"{capacity} (grpo-service worker --devices N --queue {body.queue})"
    )
    return [FieldError(path=path, message=message)]


def add_no_worker_event(session: Session, job: Job) -> None:
    """The `no_worker` event of a job whose queue has no live worker."""
    message = (
        f"no live worker serves queue '{job.queue}': the job stays queued until a worker "
        f"for it starts (grpo-service worker --queue {job.queue})"
    )
    lifecycle.add_event(session, job.id, "no_worker", message, {"queue": job.queue})
