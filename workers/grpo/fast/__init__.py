"""The fast engine: the reference path's numbers with less work, behind one `Backend`.

What it does and why is in docs/engine.md. In short: Llama-family models (full weights or plain
LoRA) decode, score and train through a lean forward of the same maths (`lean*.py`); every model
runs each distinct prompt of a group once, drops ended rows from the decode batch, and feeds a
completion only up to its end; the on-policy training forward replays the decode's matmul
outputs (`replay.py`). `backend.select_backend` chooses this backend unless `GRPO_ENGINE` is
`reference`; the tests pin it to the reference path (completions, log-probs, gradients).
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch
from torch import Tensor

from workers.grpo.fast.lean import supported
from workers.grpo.fast.logprobs import completion_logprobs
from workers.grpo.fast.replay import DecodeRecord, Replay
from workers.grpo.fast.sampling import FastSampler
from workers.grpo.packing import Pack, packed_logprobs
from workers.grpo.sampling import Generation
from workers.models.layout import use_cpu_weight_layout


def supports(model: Any) -> bool:
    """Every transformers causal LM: the lean forward where `lean.supported`, its own forward
    (prompts shared, ended rows dropped through its KV cache) otherwise."""
    return hasattr(model, "config") and hasattr(model, "get_input_embeddings")


def _prepare(model: Any) -> None:
    """On CPU, linear weights column-major where decoding goes through the model's own forward
    (`workers.models.layout`); the lean decoder packs row-major ones."""
    if next(model.parameters()).device.type != "cpu":
        return
    training = model.training
    model.eval()  # decoding runs in eval mode (LoRA dropout then does nothing)
    lean = supported(model, 0)
    model.train(training)
    if not lean:
        use_cpu_weight_layout(model, column_major=True)


def _inputs(out: Generation, rows: slice, cols: slice) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (
        out.prompt_ids[rows],
        out.prompt_mask[rows],
        out.completion_ids[rows, cols],
        out.completion_mask[rows, cols],
    )


class _HostSide(TypedDict):
    lengths: list[int] | None
    groups: list[int] | None


def _host_side(out: Generation, rows: slice) -> _HostSide:
    """The rows' completion lengths and groups as the sampler knows them on the host (None
    where it does not): the forward then reads neither from the device."""
    n = out.completion_ids.shape[0]
    g = out.group_size
    return {
        "lengths": None if out.lengths is None else out.lengths[rows],
        "groups": None if g is None else [i // g for i in range(*rows.indices(n))],
    }


class FastBackend:
    """`backend.Backend` through the fast forwards; with `record`, training rollouts keep the
    decode's matmul outputs (`Generation.backend_state`) for the first training forward."""

    name = "fast"

    def __init__(self, record: bool = False) -> None:
        self.record = record

    def prepare(self, model: Any) -> None:
        _prepare(model)

    def sampler(self, model: Any, tokenizer: Any, generator: torch.Generator) -> FastSampler:
        return FastSampler(model, tokenizer, generator, record=self.record)

    def logprobs(
        self, model: Any, out: Generation, rows: slice, cols: slice, temperature: float
    ) -> Tensor:
        lp, _ = completion_logprobs(
            model, *_inputs(out, rows, cols), temperature, **_host_side(out, rows)
        )
        return lp

    def forward(
        self,
        model: Any,
        out: Generation,
        rows: slice,
        cols: slice,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        tape = self._replay(model, out, rows, cols)
        return completion_logprobs(
            model, *_inputs(out, rows, cols), temperature, with_entropy, tape,
            **_host_side(out, rows),
        )  # fmt: skip

    def packed_forward(
        self, model: Any, out: Generation, pack: Pack, temperature: float, with_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The reference path's packed forward (the model's own, `packing.py`): the lean forward
        already feeds each completion only up to its end and each prompt once per group; packing
        its row set too is left for when it pays. A decode record is not used: drop it."""
        out.backend_state = None
        return packed_logprobs(model, out, pack, temperature, with_entropy)

    @staticmethod
    def _replay(model: Any, out: Generation, rows: slice, cols: slice) -> Replay | None:
        """The decode's record of these rows, when `model` made it with its present weights;
        the last rows use it up."""
        record = out.backend_state
        if not isinstance(record, DecodeRecord) or not record.usable_by(model):
            return None
        n = out.completion_ids.shape[0]
        last = range(*rows.indices(n))[-1] == n - 1
        if last:
            out.backend_state = None  # its memory goes as the forward consumes it
        return Replay(record, rows, cols.stop - 1, release=last)
