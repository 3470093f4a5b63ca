"""The engine's side of the Tinker API, as plain dataclasses (no torch: the service imports them).

They mirror the official `tinker` SDK 0.38.0 (`tinker/types/`): a `Datum`'s model input is its
chunks flattened to token ids; `loss_fn_inputs` keep the SDK's names (`target_tokens`,
`weights`, `logprobs`, `advantages`, ...), each a list as long as the tokens. Defaults are the
SDK's (`AdamParams`, `SamplingParams`, `LoraConfig`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

# Limits the API checks before queueing and the engine again (workers/tinker/validation.py):
MAX_LORA_RANK = 128  # a run's adapter and its Adam moments stay small beside the shared base
MAX_SAMPLES = 64  # sequences one sample request draws


class TinkerInputError(ValueError):
    """A request the engine refuses; `field` names what is wrong (a JSON path such as
    `data[0].loss_fn_inputs.target_tokens`), the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TimeLimitExceeded(RuntimeError):
    """A request ran past its time limit and was stopped at a step boundary (`Deadline`); what
    it had changed of its run is put back."""


@dataclass(frozen=True)
class Deadline:
    """When a request must stop: the engine calls `check` between its steps (a micro-batch of
    a forward / forward_backward, a decoding step of a sample), so a request past its time is
    stopped there, not run to its end. `at`: a time.monotonic() value."""

    at: float
    seconds: float  # the limit, for the message

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def check(self, done: int, steps: int, unit: str) -> None:
        """Before step `done` of `steps` (0-based): TimeLimitExceeded once past the time."""
        if time.monotonic() >= self.at:
            raise TimeLimitExceeded(
                f"stopped after {done} of {steps} {unit}, past its time limit of "
                f"{self.seconds:g} s: nothing it computed was kept"
            )


@dataclass
class Datum:
    tokens: list[int]  # the model input, its chunks flattened to token ids
    loss_fn_inputs: dict[str, list[float] | list[int]] = field(default_factory=dict)


@dataclass
class AdamParams:
    """One optimiser step's hyper-parameters (the SDK's defaults; decoupled weight decay)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # the global gradient norm's cap; 0 = no clipping


@dataclass
class SamplingParams:
    """How `sample` draws. `max_tokens` None: up to the model's context. `stop` None: the
    tokenizer's EOS ends a sequence; token ids: those (and only those) end it; strings: a
    sequence ends on the token that completes one (EOS still ends it); []: nothing but
    `max_tokens` ends it. `seed` None: a fresh draw each time. `temperature` 0: greedy."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no limit
    stop: str | list[str] | list[int] | None = None
    seed: int | None = None


@dataclass
class LoraConfig:
    """A run's adapter. `target_modules` None: every linear layer the `train_*` flags select
    (attention, MLP, the unembedding), as the SDK's LoraConfig does; a list: those module names
    (e.g. `q_proj`), the flags ignored. An unembedding tied to the embedding gets no adapter.
    `seed` None: 0 (initialisation is reproducible)."""

    rank: int
    target_modules: list[str] | None = None
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclass
class ForwardResult:
    loss_fn_outputs: list[dict[str, list[float]]]  # per datum: logprobs, elementwise_loss
    metrics: dict[str, float]  # "loss:sum"


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]  # the sampler's log pi of each token, under softmax(logits / T)
    stop_reason: Literal["stop", "length"]


@dataclass
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None  # first None; None when not asked
