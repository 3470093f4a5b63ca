"""The JSON bodies of the Tinker routes, as the official SDK (tinker 0.38.0) sends and reads
them (its `tinker/types/`). Requests ignore fields we do not use (the SDK adds new ones between
releases, and every body carries a `type` tag); responses carry what the SDK's models need."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# user_metadata's limits (docs/tinker.md): it is kept with a run or a checkpoint and answered in
# every listing of them, so its size is bounded as any stored field is.
MAX_METADATA_KEYS = 64
MAX_METADATA_KEY_CHARS = 128
MAX_METADATA_VALUE_CHARS = 4096
MAX_METADATA_BYTES = 16 * 1024  # keys and values together, in UTF-8


def _bounded(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """`metadata` if within the limits (a value counted as stored: its text), else why not."""
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(f"{len(metadata)} keys; the limit is {MAX_METADATA_KEYS}")
    total = 0
    for key, value in metadata.items():
        text = value if isinstance(value, str) else str(value)
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise ValueError(f"a key of {len(key)} characters; the limit is "
                             f"{MAX_METADATA_KEY_CHARS}")  # fmt: skip
        if len(text) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(f"the value of '{key}' has {len(text)} characters; the limit is "
                             f"{MAX_METADATA_VALUE_CHARS}")  # fmt: skip
        total += len(key.encode(errors="surrogatepass")) + len(text.encode(errors="surrogatepass"))
    if total > MAX_METADATA_BYTES:
        raise ValueError(f"{total} bytes of keys and values; the limit is {MAX_METADATA_BYTES}")
    return metadata


UserMetadata = Annotated[dict[str, Any] | None, AfterValidator(_bounded)]
StringMetadata = Annotated[dict[str, str] | None, AfterValidator(_bounded)]


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class ClientConfigIn(_In):
    sdk_version: str | None = None


class CreateSessionIn(_In):
    tags: list[str] = []
    user_metadata: UserMetadata = None
    sdk_version: str | None = None
    project_id: str | None = None
    display_name: str | None = None


class SessionIdIn(_In):
    session_id: str


class LoraConfigIn(_In):
    rank: int
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfigIn(_In):
    type: str = "adamw"


class CreateModelIn(_In):
    session_id: str
    model_seq_id: int = 0
    base_model: str
    user_metadata: UserMetadata = None
    lora_config: LoraConfigIn | None = None
    optimizer_config: OptimizerConfigIn = OptimizerConfigIn()


class ModelIdIn(_In):
    model_id: str


class AdamParamsIn(_In):
    """The SDK's AdamParams, defaults as its own."""

    learning_rate: float = Field(default=1e-4, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-12, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip_norm: float = Field(default=0.0, ge=0)


class OptimStepIn(_In):
    model_id: str
    seq_id: int | None = None
    adam_params: AdamParamsIn | None = None
    optimizer_params: dict[str, Any] | None = None  # another optimizer family: refused


class SaveWeightsIn(_In):
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    ttl_seconds: int | None = None
    overwrite: bool = False
    user_metadata: StringMetadata = None


class SaveForSamplerIn(SaveWeightsIn):
    sampling_session_seq_id: int | None = None
    kind: str = "snapshot"


class CheckpointTtlIn(_In):
    ttl_seconds: int | None = None  # null: the checkpoint never expires


class LoadWeightsIn(_In):
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: UserMetadata = None
    path: str
    optimizer: bool = False


class CreateSamplingSessionIn(_In):
    session_id: str
    sampling_session_seq_id: int = 0
    base_model: str | None = None
    model_path: str | None = None


class SamplingSessionIdIn(_In):
    sampling_session_id: str


class ChunkIn(_In):
    type: str = "encoded_text"
    tokens: list[int] | None = None


class ModelInputIn(_In):
    chunks: list[ChunkIn]


class SamplingParamsIn(_In):
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(default=1.0, ge=0)
    top_k: int = -1
    top_p: float = Field(default=1.0, gt=0, le=1)


class SampleIn(_In):
    num_samples: int = Field(default=1, ge=1)
    prompt: ModelInputIn
    sampling_params: SamplingParamsIn
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None


class RetrieveFutureIn(_In):
    request_id: str
    allow_metadata_only: bool = False


class WeightsInfoIn(_In):
    tinker_path: str


# Responses


class UntypedFuture(BaseModel):
    request_id: str
    model_id: str | None = None
    sample_sequence_ids: list[str] | None = None


class TryAgain(BaseModel):
    type: Literal["try_again"] = "try_again"
    request_id: str
    queue_state: Literal["active", "paused_capacity", "paused_rate_limit"] = "active"
    queue_state_reason: str | None = None
    queue_position: int  # ours: the tenant's own open requests ahead of this one


class SupportedModel(BaseModel):
    model_name: str
    max_context_length: int
    trainable: bool = True
    sampleable: bool = True


class Capabilities(BaseModel):
    supported_models: list[SupportedModel]


class CheckpointOut(BaseModel):
    checkpoint_id: str  # "weights/<name>" or "sampler_weights/<name>"
    checkpoint_type: Literal["training", "sampler"]
    time: str
    tinker_path: str
    size_bytes: int | None = None
    public: bool = False
    user_metadata: dict[str, str] | None = None
    expires_at: str | None = None


class Cursor(BaseModel):
    offset: int
    limit: int
    total_count: int


class CheckpointsList(BaseModel):
    checkpoints: list[CheckpointOut]
    cursor: Cursor | None = None


class TrainingRunOut(BaseModel):
    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool = True
    corrupted: bool = False
    lora_rank: int | None = None
    last_request_time: str
    last_checkpoint: CheckpointOut | None = None
    last_sampler_checkpoint: CheckpointOut | None = None
    user_metadata: dict[str, str] | None = None


class TrainingRunsList(BaseModel):
    training_runs: list[TrainingRunOut]
    cursor: Cursor
