"""The one place that chooses how the engine decodes and runs its forwards.

A `Backend` gives the three things GRPO asks of a model: a `Sampler` for G completions per
prompt, the log-probs of sampled completions under a frozen policy (pi_ref, pi_old), and the
policy's differentiable forward for the loss. The reference backend is the plain path
(`sampling.PlainSampler`, `logprobs.completion_logprobs`: the model's own forward); the fast
one (`workers.grpo.fast`) computes the same numbers with less work; the paged one samples
through transformers' continuous batching (`workers.grpo.paged`) and scores as the reference.
The engine is the job's `grpo.engine`, else `GRPO_ENGINE`, else `auto`: fast where it supports
the model (as nanoGPT picks flash attention with `if self.flash`), the reference path otherwise.
Paged is chosen by name only: on an H200 without flash attention it decoded slower than fast
(docs/engine.md, bench/README.md).
"""

from __future__ import annotations

import os
from typing import Any, Protocol, get_args

import torch
from torch import Tensor

from workers.grpo import fast
from workers.grpo.config import Engine, GRPOParams
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.packing import Pack, packed_logprobs
from workers.grpo.paged import PagedSampler, serving_refusal
from workers.grpo.sampling import Generation, PlainSampler, Sampler

ENGINES: tuple[str, ...] = get_args(Engine)


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

    def packed_forward(
        self, model: Any, out: Generation, pack: Pack, temperature: float, with_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """`forward` of a packed micro-batch (`packing.py`): log-probs (n, t) of `pack.rows`
        up to `pack.cols`; differentiable unless called in inference mode (pi_ref, pi_old)."""
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

    def packed_forward(
        self, model: Any, out: Generation, pack: Pack, temperature: float, with_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        return packed_logprobs(model, out, pack, temperature, with_entropy)


class PagedBackend(ReferenceBackend):
    """Sampling by transformers' continuous batching; the log-prob forwards of the reference."""

    name = "paged"

    def sampler(self, model: Any, tokenizer: Any, generator: torch.Generator) -> Sampler:
        return PagedSampler(model, tokenizer, generator)


def engine(grpo: GRPOParams | None = None) -> str:
    """The job's `grpo.engine`, else `GRPO_ENGINE`, else `auto`."""
    if grpo is not None and grpo.engine is not None:
        return grpo.engine
    name = os.environ.get("GRPO_ENGINE", "auto").strip().lower() or "auto"
    if name not in ENGINES:
        raise ValueError(f"GRPO_ENGINE must be one of {', '.join(ENGINES)}, not {name!r}")
    return name


def select_backend(
    model: Any, grpo: GRPOParams | None = None, own_forward: bool = False, record: bool = True
) -> Backend:
    """The backend of a run training `model` with `grpo` (`engine`). `paged` on a model it
    cannot serve is an error; `auto` takes fast where it supports the model, unless the run
    needs the model's `own_forward`
    (gradient checkpointing). The fast one keeps the decode's matmul outputs for the training
    forward only when that forward runs as one batch (`micro_batch_size` bounds memory), and
    never without `record` (a decoder whose batches no training forward replays: off-policy
    rollouts, evaluation)."""
    name = engine(grpo)
    if name == "paged":
        reason = serving_refusal(model)
        if reason is not None:
            raise ValueError(f"grpo.engine / GRPO_ENGINE paged: {reason}")
        return PagedBackend()
    if name == "reference" or own_forward or not fast.supports(model):
        return ReferenceBackend()
    whole = grpo is not None and (
        grpo.micro_batch_size is None
        or grpo.micro_batch_size >= grpo.prompts_per_step * grpo.group_size
    )
    record = record and whole
    record = record and grpo is not None and grpo.micro_batch_tokens is None  # packs: own forward
    return fast.FastBackend(record=record)
