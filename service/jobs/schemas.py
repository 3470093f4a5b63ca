from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from service.core.schemas import UtcDateTime
from workers.grpo.config import TrainSpec

Tracker = Literal["mlflow", "wandb", "tensorboard", "trackio"]
JobStatus = Literal[
    "queued", "running", "cancelling", "pausing", "paused", "succeeded", "failed", "cancelled"
]


class VerifierRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    version: int | None = Field(
        None, ge=1, le=2**31 - 1, description="Pinned to the latest when omitted."
    )
    weight: float = Field(1.0, ge=-1e6, le=1e6, allow_inf_nan=False)


MAX_DEVICES = 64  # devices (ranks) one job may ask for; a worker's declared count is the same


class Resources(BaseModel):
    """What one attempt at the job runs on."""

    model_config = ConfigDict(extra="forbid")

    devices: int = Field(
        1,
        ge=1,
        le=MAX_DEVICES,
        description="Devices (processes, one rank each: torch.distributed, FSDP2) the job "
        "trains on, on one worker; grpo.prompts_per_step must split into whole groups across "
        "them. A queue's live workers must own as many (`grpo-service worker --devices N`).",
    )
    rollout_devices: int = Field(
        0,
        ge=0,
        le=1,
        description="Of `devices`, how many only generate rollouts (0 or 1): with "
        "grpo.max_off_policy_steps >= 1 the generator decodes on its own device while the "
        "trainer trains on the other, so devices = rollout_devices + 1.",
    )


class JobCreate(TrainSpec):
    """The engine's `TrainSpec` (model, grpo, generation, lora, cadence: declared once, with its
    validators) plus what the service resolves: datasets, verifiers and the queue."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "base_model": "tiny-llama",
                    "dataset": "ds_0123456789abcdef",
                    "verifiers": [{"name": "has-digit", "weight": 1.0}],
                    "grpo": {"steps": 20, "prompts_per_step": 2, "group_size": 8},
                    "generation": {"max_new_tokens": 16},
                }
            ]
        },
    )

    name: str | None = Field(
        None, min_length=1, max_length=200, description="A name of yours for the job."
    )
    dataset: str = Field(
        min_length=1,
        max_length=200,
        description="Training dataset: its id (ds_…), or its name: the newest dataset of "
        "yours with it (the stored spec then holds the id).",
    )
    eval_dataset: str | None = Field(
        None, max_length=200, description="Held-out dataset: id, or name (the newest)."
    )
    verifiers: list[VerifierRef] = Field(
        default_factory=list,
        max_length=16,
        validate_default=True,
        description="At least one, unless an `environment` scores the episodes (then they "
        "score the final transcript and add to the episode's reward).",
    )
    eval_verifiers: list[VerifierRef] | None = Field(
        None, min_length=1, max_length=16, description="Defaults to verifiers."
    )
    base_model: str = Field(
        min_length=1,
        max_length=200,
        description="A catalog model's name (GET /v1/models) or one of your checkpoint ids "
        "(ckpt_…) to fine-tune from.",
    )
    queue: str = Field("gpu", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    resources: Resources = Field(default_factory=Resources)
    rollouts: str = Field(
        "all",
        pattern=r"^(all|none|sample:[1-9][0-9]{0,5})$",
        description="Which completions are stored (GET /v1/jobs/{id}/rollouts): `all`, "
        "`sample:K` (K per step and eval run, picked from the job's seed) or `none`.",
    )
    preflight: Literal["require", "off"] = Field(
        "off",
        description="`require`: before its first step the worker runs the pre-flight "
        "(POST /v1/jobs/preflight) and, on a fatal warning, fails the job with "
        "`preflight_failed` (docs/preflight.md).",
    )
    # Trackers (docs/trackers.md): options only; connections are the operator's settings and
    # credentials are tenant secrets, named here, never typed into a job.
    report_to: list[Tracker] = Field(
        default_factory=list, max_length=16, description="Where else the curves go (TRL's)."
    )
    tracker_project: str | None = Field(
        None, min_length=1, max_length=200, description="MLflow experiment, W&B/Trackio project."
    )
    wandb_entity: str | None = Field(None, min_length=1, max_length=200)
    wandb_secret: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.\-]{1,100}$", description="Your secret with the W&B API key."
    )
    trackio_space_id: str | None = Field(
        None, min_length=1, max_length=200, description="A Hugging Face Space (unset: local)."
    )
    trackio_secret: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.\-]{1,100}$", description="Your secret with the HF token."
    )

    @field_validator("verifiers")
    @classmethod
    def _something_scores(cls, v: list[VerifierRef], info: ValidationInfo) -> list[VerifierRef]:
        """A reward comes from verifiers, an environment or both. `environment` (a TrainSpec
        field) is validated before this one; absent from `info.data` when it was invalid."""
        if not v and "environment" in info.data and info.data["environment"] is None:
            raise ValueError(
                "a job needs a reward: list a verifier here (`verifiers: [{name: ...}]`, one "
                "registered with `grpo verifiers create` or POST /v1/verifiers) or name an "
                "`environment`"
            )
        return v


def _fork_step(value: object) -> int | str:
    """One error for a bad step (a union would list one per member)."""
    if value == "latest":
        return "latest"
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2**31 - 1:
        return value
    raise ValueError("a checkpoint's step (an integer from 1) or 'latest'")


ForkStep = Annotated[
    int | str,
    PlainValidator(_fork_step),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"const": "latest"}]}),
]


class ForkCreate(BaseModel):
    """POST /v1/jobs/{id}/fork: a new job from one of this job's checkpoints, some knobs
    changed (docs/lifecycle.md lists which)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"step": 50, "overrides": {"grpo": {"learning_rate": 5e-6, "steps": 200}}},
                {"step": "latest", "overrides": {"verifiers": [{"name": "math", "version": 3}]}},
            ]
        },
    )

    step: ForkStep = Field(
        description="The checkpoint's step (GET /v1/jobs/{id}/checkpoints), or `latest`."
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Spec fields to change, deep-merged into the parent's spec: "
        "`{grpo: {learning_rate, beta, steps, ...}, verifiers, generation: {...}, ...}`.",
    )


class JobErrorOut(BaseModel):
    code: str
    message: str


class ForkedFrom(BaseModel):
    job_id: str = Field(description="The job forked.")
    step: int = Field(description="Its checkpoint's step: the fork trains from step + 1.")
    checkpoint_id: str = Field(description="That checkpoint (kept while the fork is unfinished).")


class JobOut(BaseModel):
    id: str
    status: JobStatus
    spec: dict[str, Any]
    step: int
    total_steps: int
    latest_metrics: dict[str, Any] | None
    error: JobErrorOut | None
    created_at: UtcDateTime
    started_at: UtcDateTime | None
    finished_at: UtcDateTime | None
    parent_checkpoint: str | None = Field(
        None, description="The checkpoint this job was fine-tuned from (its lineage)."
    )
    forked_from: ForkedFrom | None = Field(
        None, description="POST /v1/jobs/{id}/fork: the job and checkpoint it continues from."
    )
    memory_estimate: dict[str, int] | None = Field(
        None,
        description="Peak memory estimated at submission, in bytes, by part (weights, "
        "workspace, optimizer, reference, kv_cache, decode_record, activations, total), on one "
        "device (with resources.devices > 1: one device's share); metrics' peak_memory_bytes "
        "is the measured peak.",
    )


class PinnedVerifier(BaseModel):
    name: str
    version: int
    weight: float
    sha256: str = Field(description="Of the version's kind+config: the exact code scored.")


class MetricsPage(BaseModel):
    data: list[dict[str, Any]] = Field(description="One row per step: {step, ...metrics}.")
    verifiers: list[PinnedVerifier] = Field(
        default_factory=list,
        description="The pinned verifier versions behind `reward/<name>` and `errors/<name>`.",
    )
    eval_verifiers: list[PinnedVerifier] = Field(
        default_factory=list, description="The pinned versions behind `eval_reward/<name>`."
    )


class EventOut(BaseModel):
    id: int
    at: UtcDateTime
    type: str
    message: str
    data: dict[str, Any]


class EventsPage(BaseModel):
    data: list[EventOut]


class CheckpointOut(BaseModel):
    id: str
    step: int
    size_bytes: int
    sha256: str
    format: Literal["full", "peft-adapter"]
    created_at: UtcDateTime


class CheckpointsPage(BaseModel):
    data: list[CheckpointOut]


EstimateBasis = Literal["job", "preflight", "model_size"]


class EstimateOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "device_seconds": 5400.0,
                    "completion_tokens": 819200,
                    "trained_tokens": 1228800,
                    "flops": 2.7e17,
                    "device_flops": 5e13,
                    "basis": "job",
                    "basis_id": "job_0641a2b3c4d5e6f7a8b9c0d1e2",
                }
            ]
        }
    )

    device_seconds: float = Field(description="Device-seconds the job would take.")
    completion_tokens: int = Field(description="Completion tokens it would sample.")
    trained_tokens: int = Field(description="Tokens through its training passes.")
    flops: float = Field(
        description="Its FLOPs: 2·params per sampled token, 6·params per trained token, "
        "2·params per trained token of one pass for the reference model (beta > 0)."
    )
    device_flops: float = Field(description="The FLOP/s per device the seconds assume.")
    basis: EstimateBasis = Field(
        description="`job`: the throughput and completion lengths your last finished job on "
        "this model measured; `preflight`: your last pre-flight on this model; `model_size`: "
        "the model's size and the queue's configured FLOP/s, completions at max_new_tokens."
    )
    basis_id: str | None = Field(None, description="The job or pre-flight it is based on.")
