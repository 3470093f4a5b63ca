"""Typed hyper-parameters of a GRPO run: one object, stored with the job and in every checkpoint.

These pydantic models are the one declaration of the job spec's training part: the API's request
model (`service.jobs.schemas.JobCreate`) extends `TrainSpec`, so every check here runs at
submission and a spec the engine would refuse is a 422 naming its field. This module imports
neither torch nor FastAPI, so both sides can use it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class _Strict(BaseModel):
    # No NaN or infinity anywhere: one would reach the loss and train every weight to NaN.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Text = Annotated[str, Field(min_length=1, max_length=200)]
# The decoders a run can ask for (`backend.select_backend` chooses by it; docs/engine.md).
Engine = Literal["auto", "fast", "reference", "paged"]


class GRPOParams(_Strict):
    """The optimisation: groups, advantages, the clipped surrogate and its KL penalty."""

    steps: int = Field(100, ge=1, le=1_000_000, description="Optimizer steps to run.")
    prompts_per_step: int = Field(4, ge=1, le=4096, description="Prompts drawn per step.")
    group_size: int = Field(8, ge=2, le=1024, description="Completions sampled per prompt (G).")
    learning_rate: float = Field(1e-5, gt=0, le=1.0, description="AdamW peak learning rate.")
    beta: float = Field(
        0.04, ge=0, le=100, description="Weight of the k3 KL penalty; 0 skips the reference."
    )
    clip_epsilon: float = Field(0.2, gt=0, lt=1, description="Lower clip range: ratio >= 1-eps.")
    clip_epsilon_high: float | None = Field(
        None, gt=0, le=10, description="Upper clip range (DAPO); null means equal to clip_epsilon."
    )
    std: Literal["population", "sample", "none"] = Field(
        "population", description="Group std used to scale advantages; none = Dr. GRPO."
    )
    loss_aggregation: Literal["sequence_mean", "token_mean", "constant"] = Field(
        "sequence_mean", description="How per-token losses are averaged over the batch."
    )
    num_iterations: int = Field(1, ge=1, le=64, description="Optimisation passes per batch (mu).")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6, description="Gradient norm clip.")
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Seed for data order, sampling and initialisation."
    )
    warmup_steps: int = Field(
        0, ge=0, le=1_000_000, description="Linear learning-rate warm-up steps."
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="Schedule after warm-up."
    )
    weight_decay: float = Field(0.0, ge=0, le=1.0, description="AdamW weight decay.")
    micro_batch_size: int | None = Field(
        None, ge=1, description="Completions per forward/backward; null = the whole batch."
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=2,
        le=1 << 22,
        description="Pack each forward/backward's sequences (prompt + completion) end to end "
        "without padding, at most this many tokens per micro-batch (veRL's use_remove_padding "
        "with dynamic batch size); at least the longest prompt + max_new_tokens. Null: "
        "micro-batches of micro_batch_size rows, padded.",
    )
    mask_truncated_completions: bool = Field(
        False, description="Completions cut at max_new_tokens get no loss (DAPO overlong filter)."
    )
    skip_zero_std_groups: bool = Field(
        False, description="Dynamic sampling (DAPO): replace groups whose rewards are all equal."
    )
    max_resample_rounds: int = Field(
        4, ge=0, le=64, description="Most extra draws per step when skip_zero_std_groups is on."
    )
    max_off_policy_steps: int = Field(
        0,
        ge=0,
        le=8,
        description="Rollouts may come from the policy of up to K optimizer steps ago: they are"
        " generated in a thread of their own while the previous step trains (0 = synchronous).",
    )
    importance_sampling_cap: float | None = Field(
        2.0,
        ge=1.0,
        le=100.0,
        description="Truncated importance sampling of off-policy rollouts: each token's policy"
        " gradient times min(pi_old / pi_sampler, cap); null turns the correction off.",
    )
    engine: Engine | None = Field(
        None,
        description="How rollouts are decoded: fast (the lean CPU path), reference (the model's"
        " own forward), paged (transformers' continuous batching; llama, mistral, qwen2, qwen3),"
        " auto (fast where it supports the model); null = the worker's GRPO_ENGINE (default auto).",
    )

    @field_validator("micro_batch_size")
    @classmethod
    def _divides_the_batch(cls, value: int | None, info: ValidationInfo) -> int | None:
        # Every micro-batch divides by the whole batch's denominator: equal parts keep the
        # accumulated gradient equal to the one-batch gradient.
        p, g = info.data.get("prompts_per_step"), info.data.get("group_size")
        if value is not None and p is not None and g is not None and (p * g) % value:
            raise ValueError(f"must divide prompts_per_step * group_size = {p * g}")
        return value

    @field_validator("micro_batch_tokens")
    @classmethod
    def _one_micro_batching(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("micro_batch_size") is not None:
            raise ValueError("set micro_batch_size or micro_batch_tokens, not both")
        return value

    @property
    def clip_high(self) -> float:
        return self.clip_epsilon if self.clip_epsilon_high is None else self.clip_epsilon_high


class GenerationParams(_Strict):
    """How completions are sampled from the current policy."""

    max_new_tokens: int = Field(256, ge=1, le=32768, description="Completion length cap.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, le=1_000_000, description="Top-k sampling; 0 disables it.")
    stop: list[Text] = Field(default_factory=list, max_length=16, description="Stop strings.")


class LoraParams(_Strict):
    """A LoRA adapter (peft) instead of full fine-tuning."""

    r: int = Field(16, ge=1, le=1024)
    alpha: float = Field(32, gt=0, le=1e5)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: Text | list[Text] = Field("all-linear", max_length=64)
    export_merged: bool = Field(
        False, description="Also write merged full weights to `merged/` in every checkpoint."
    )


class EnvironmentParams(_Strict):
    """A multi-turn environment the job trains on (its source is resolved by the service)."""

    name: str = Field(min_length=1, max_length=100, description="A registered environment.")
    version: int | None = Field(
        None, ge=1, le=2**31 - 1, description="Pinned to the latest version at submission."
    )
    max_turns: int = Field(
        4, ge=1, le=64, description="Assistant turns per episode at most (then truncated)."
    )


class TrainSpec(_Strict):
    """What the engine needs to train: the model, the knobs, the cadence of side effects."""

    base_model: str = Field(
        min_length=1, max_length=1000, description="Local path or model id the workers load."
    )
    grpo: GRPOParams = Field(default_factory=GRPOParams)
    generation: GenerationParams = Field(default_factory=GenerationParams)
    lora: LoraParams | None = None
    environment: EnvironmentParams | None = Field(
        None,
        description="Train on episodes of this environment (multi-turn, tools); verifiers, "
        "when given too, score the final transcript and add to the episode's reward.",
    )
    precision: Literal["bf16", "fp32"] | None = Field(
        None,
        description="bf16: forward passes under bf16 autocast, master weights, gradients and "
        "optimizer state in fp32, the frozen reference in bf16; fp32: everything in fp32; "
        "null: bf16 on a CUDA device that supports it, fp32 elsewhere.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each layer's activations in the backward pass instead of "
        "keeping them: less memory for about a third more compute (the model's own forward).",
    )
    checkpoint_every: int = Field(50, ge=1, description="Save a checkpoint every N steps.")
    keep_checkpoints: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Keep only the newest N periodic checkpoints, plus the final one (as TRL's"
        " save_total_limit); null keeps every checkpoint.",
    )
    eval_every: int = Field(25, ge=1, description="Evaluate on the held-out set every N steps.")

    @field_validator("environment")
    @classmethod
    def _episodes_on_policy(
        cls, value: EnvironmentParams | None, info: ValidationInfo
    ) -> EnvironmentParams | None:
        # Episodes are played on the trainer's thread with the session it holds: not ahead.
        grpo = info.data.get("grpo")
        if value is not None and grpo is not None and grpo.max_off_policy_steps:
            raise ValueError("environment episodes run on-policy: set grpo.max_off_policy_steps 0")
        return value
