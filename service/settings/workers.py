"""Workers, their queues and devices: leases, the reconciler, watchdogs, Hub access, estimates."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, SecretStr, field_validator

# The broker queues of multi-device jobs (`service.worker.celery_queue`: `gpu.x2`); a declared
# queue named so would share its broker queue with another queue's device class.
QUEUE_NAME_RESERVED = re.compile(r"\.x\d+\Z")


class QueueSettings(BaseModel):
    """One queue the operator runs workers for (`grpo-service worker --queue NAME`)."""

    device_memory_gib: float | None = Field(
        None, gt=0, description="Memory of one device of this queue's workers (unset: unchecked)."
    )
    step_timeout_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Wall-clock budget of one training step on this queue's workers; past it "
        "the worker kills the training process (unset: GRPO_STEP_TIMEOUT_S).",
    )
    device_flops: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Sustained FLOP/s of one device of this queue's workers, for "
        "POST /v1/jobs/estimate (unset: GRPO_ESTIMATE_DEVICE_FLOPS).",
    )


class WorkerSettings(BaseModel):
    """How workers claim, run and give up jobs, on which queues and devices."""

    lease_seconds: float = Field(
        60.0, gt=0, description="A worker's claim on a job lasts this long."
    )
    heartbeat_seconds: float = Field(10.0, gt=0, description="How often a worker renews its lease.")
    reconcile_seconds: float = Field(15.0, gt=0, description="How often the reconciler runs.")
    requeue_after_seconds: float = Field(
        60.0, gt=0, description="Re-enqueue a queued job whose message seems lost after this long."
    )
    max_attempts: int = Field(3, ge=1, description="Claims a job gets before it fails for good.")
    worker_devices: int = Field(
        1,
        ge=1,
        le=64,
        description="Devices a `grpo-service worker` owns (its --devices default): it trains "
        "jobs of resources.devices up to this many, one rank per device.",
    )
    step_timeout_s: float = Field(
        3600.0,
        gt=0,
        allow_inf_nan=False,
        description="A training step (and each checkpoint upload) must finish within this; past "
        "it the worker kills the training process. A queue's step_timeout_s overrides it.",
    )
    startup_timeout_s: float = Field(
        3600.0,
        gt=0,
        allow_inf_nan=False,
        description="From the training process's start to its first step (model download and "
        "load, resume checkpoint); past it the worker kills the training process.",
    )
    cancel_grace_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="A cancelled job's training process still running after this is killed.",
    )
    queues: dict[str, QueueSettings] = Field(
        default_factory=lambda: {"gpu": QueueSettings()},
        description='Queues jobs may name, as JSON: {"gpu": {"device_memory_gib": 80}}.',
    )
    hf_token: SecretStr | None = Field(
        None, description="Hugging Face token for gated catalog models (`models add`, workers)."
    )
    hf_offline: bool = Field(
        False, description="Never reach the Hub: catalog models come from the HF_HOME cache."
    )

    # Usage (docs/usage.md): POST /v1/jobs/estimate without a measured basis.
    estimate_device_flops: float = Field(
        5e10,
        gt=0,
        allow_inf_nan=False,
        description="Sustained FLOP/s of one device, for estimates on queues without their "
        "own `device_flops`.",
    )

    @field_validator("queues")
    @classmethod
    def _no_device_class_names(cls, queues: dict[str, QueueSettings]) -> dict[str, QueueSettings]:
        for name in queues:
            if QUEUE_NAME_RESERVED.search(name):
                raise ValueError(
                    f"queue {name!r}: names ending in '.x<N>' are reserved for the broker "
                    "queues of N-device jobs"
                )
        return queues

    def device_flops_for(self, queue: str) -> float:
        """The sustained FLOP/s an estimate assumes for one device of `queue`'s workers."""
        own = self.queues.get(queue)
        return own.device_flops if own and own.device_flops else self.estimate_device_flops

    def step_timeout_for(self, queue: str) -> float:
        """The step budget of `queue`'s workers: its own, else the global one."""
        own = self.queues.get(queue)
        return own.step_timeout_s if own and own.step_timeout_s else self.step_timeout_s
