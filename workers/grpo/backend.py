"""The one place that chooses how the engine decodes and runs its forwards.

A `Backend` gives the three things GRPO asks of a model: a `Sampler` for G completions per
prompt, the log-probs of sampled completions under a frozen policy (pi_ref, pi_old), and the
policy's differentiable forward for the loss. The reference backend is the plain path
(`sampling.PlainSampler`, `logprobs.completion_logprobs`: the model's own forward); the fast
one (`workers.grpo.fast`) computes the same numbers with less work. `GRPO_ENGINE=reference`
forces the reference backend; `fast` (the default) takes the fast one where it supports the
model, as nanoGPT picks flash attention with `if self.flash`.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import torch
from torch import Tensor

from workers.grpo import fast
from workers.grpo.config import GRPOParams
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.sampling import Generation, PlainSampler, Sampler

ENGINES = ("fast", "reference")


class Backend(Protocol):
    """Sampling and the log-prob forwards of one run. `rows` and `cols` select a micro-batch
    of a Generation; `out.backend_state` is the backend's own business."""

    name: str

    def prepare(self, model: Any) -> None:
        """Lay a model's weights out for this backend (once per model, before training)."""
        ...

    def sampler(self, model: Any, tokenizer: Any, generator: torch.Generator) -> Sampler: ...

    def logprobs(
        self, model: Any, out: Generation, rows: slice, cols: slice, temperature: float
    ) -> Tensor:
        """Log-probs (n, t) of the completions under `model` in inference mode (pi_ref, pi_old)."""
        ...

    def forward(
        self,
        model: Any,
        out: Generation,
        rows: slice,
        cols: slice,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (n, t) with their gradient, and with `with_entropy` the entropy (n, t)."""
        ...


class ReferenceBackend:
    """The plain path: the model's own forward, one token at a time, and one forward to score."""

    name = "reference"

    def prepare(self, model: Any) -> None:
        return None

    def sampler(self, model: Any, tokenizer: Any, generator: torch.Generator) -> Sampler:
        return PlainSampler(model, tokenizer, generator)

    def logprobs(
        self, model: Any, out: Generation, rows: slice, cols: slice, temperature: float
    ) -> Tensor:
        return self.forward(model, out, rows, cols, temperature, False)[0]

    def forward(
        self,
        model: Any,
        out: Generation,
        rows: slice,
        cols: slice,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        return completion_logprobs(
            model,
            out.prompt_ids[rows],
            out.prompt_mask[rows],
            out.completion_ids[rows, cols],
            out.completion_mask[rows, cols],
            temperature,
            with_entropy,
        )


def engine() -> str:
    """`GRPO_ENGINE`: `fast` (default) or `reference`."""
    name = os.environ.get("GRPO_ENGINE", "fast").strip().lower() or "fast"
    if name not in ENGINES:
        raise ValueError(f"GRPO_ENGINE must be one of {', '.join(ENGINES)}, not {name!r}")
    return name


def select_backend(
    model: Any, grpo: GRPOParams | None = None, own_forward: bool = False
) -> Backend:
    """The backend of a run training `model` with `grpo`: fast where it supports the model,
    unless `GRPO_ENGINE=reference` or the run needs the model's `own_forward` (gradient
    checkpointing). The fast one keeps the decode's matmul outputs for the training forward
    only when that forward runs as one batch (`micro_batch_size` bounds memory otherwise)."""
    if engine() == "reference" or own_forward or not fast.supports(model):
        return ReferenceBackend()
    batch = None if grpo is None else grpo.prompts_per_step * grpo.group_size
    record = grpo is not None and (grpo.micro_batch_size is None or grpo.micro_batch_size >= batch)
    return fast.FastBackend(record=record)
