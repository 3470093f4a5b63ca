"""The sampling pass's matmul outputs, replayed in the on-policy training forward.

On-policy, the training forward of a step computes, token by token, what the decode loop has
just computed with the same weights: every linear map of every completion token it fed. The
decode loop records those outputs (`DecodeRecord`); the training forward then takes them as the
outputs of its linear maps (`Replay`) instead of multiplying again, and autograd runs as usual:
each replayed map's backward is the linear map's own (grad_input = grad_output W,
grad_W = grad_output^T input), with the input the training forward recomputed (norms, RoPE,
attention, SwiGLU: the cheap element-wise part). The matmuls of the forward are a third of the
training pass's FLOPs; the numbers differ from a fresh forward by float summation order only.

Guards: a record is used once, by the policy that decoded it, with unchanged weights (parameter
version counters), on the rows and columns the decode loop fed. The LM head and the prompt
positions (one row per distinct prompt in the training forward) are computed, not replayed.
LoRA: the decode loop's weights hold the adapters' updates merged in, so a replayed output
holds the update too; the training forward adds only its gradient there (`lean.linear_map`),
and the frozen base weights get no gradient product.
The training forward feeds a completion's positions only up to its end
(`lean_forward.fed_index` of the lengths the sampler stores in the record): so does the replay.
The record travels in `Generation.backend_state` from `FastSampler` to `FastBackend.forward`;
it is kept only when the batch trains as one micro-batch (it holds the whole batch's outputs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workers.grpo.fast.lean import Linear, apply_linear
from workers.grpo.fast.lean_forward import fed_index


def weight_versions(model: Any) -> list[int]:
    """The version counters of the model's parameters (an in-place update bumps them)."""
    return [p._version for p in model.parameters()]


class DecodeRecord:
    """The outputs (A, 1, out) of every linear map at every decode step, per (layer, map name).

    Step j (kept j-th) fed completion token j, the training forward's position j, to the A
    rows of the batch of N still decoded; the sampler calls `begin(j, rows)` before each step.
    A `lean.Tape` of the decode steps. The outputs are kept as they are (a reference each: no
    copy in the decode loop, where a copy into a preallocated buffer costs a small model's
    generation much of its time) and joined when replayed; rows no longer decoded are zeros
    there (they only ever feed positions past a completion's end: masked out, gradient 0).
    """

    def __init__(self, model: Any, batch: int, lora_merged: bool = False) -> None:
        """`lora_merged`: the decode's weights hold LoRA updates merged in (`lean_lora`)."""
        self.model, self.versions, self.batch = model, weight_versions(model), batch
        self.lora_merged = lora_merged
        self.column = -1
        self.outputs: dict[tuple[int, str], list[Tensor]] = {}
        self.rows: dict[int, Tensor] = {}  # step -> the rows (A,) it decoded, where not all N
        self.lengths: list[int] | None = None  # the completions' lengths, set by the sampler

    def begin(self, column: int, rows: Tensor | None) -> None:
        """The next step feeds completion token `column` to `rows` (A,) (None: all)."""
        self.column = column
        if rows is not None:
            self.rows[column] = rows

    def __call__(self, x: Tensor, maps: Linear, layer: int, name: str) -> Tensor:
        """The map's output (A, 1, out) for the step's input x (A, 1, in), kept."""
        y = apply_linear(x, maps)
        steps = self.outputs.setdefault((layer, name), [])
        if len(steps) != self.column:
            raise RuntimeError(f"decode step {self.column} recorded out of order")
        steps.append(y)
        return y

    def usable_by(self, model: Any) -> bool:
        return model is self.model and weight_versions(model) == self.versions


class Replay:
    """The recorded outputs of rows `rows`, positions [0, t), for one training forward.

    With `release` (the record's last use) each (layer, map) is dropped once handed out, so
    that the record's memory goes as the forward consumes it."""

    def __init__(self, record: DecodeRecord, rows: slice, t: int, release: bool) -> None:
        if t > record.column + 1:
            raise ValueError(f"{t} positions asked, {record.column + 1} recorded")
        if record.lengths is None:
            raise ValueError("the record holds no completion lengths")
        self.record, self.rows, self.t, self.release = record, rows, t, release
        device = next(record.model.parameters()).device
        self.fed = fed_index(record.lengths[rows], t, device)  # (K,), None: all n t
        fed = len(record.lengths[rows]) * t if self.fed is None else self.fed.shape[0]
        # the replayed rows whose outputs hold LoRA updates already (`lean.linear_map`)
        self.merged_rows = fed if record.lora_merged else 0

    def __call__(self, x: Tensor, maps: Linear, layer: int, name: str) -> Tensor:
        """The map's output (1, R + K, out) for x (1, R + K, in): R rows computed (the
        training forward's prompt rows, `lean_forward.lean_logits`), then the K fed completion
        positions (row by row) replayed."""
        outputs = self.record.outputs
        steps = outputs.pop((layer, name)) if self.release else outputs[layer, name]
        steps = [self._every_row(j, step) for j, step in enumerate(steps[: self.t])]  # (N, 1, out)
        if range(*self.rows.indices(steps[0].shape[0])) != range(steps[0].shape[0]):
            steps = [step[self.rows] for step in steps]  # t of (n, 1, out)
        n, _, width = steps[0].shape
        fed = n * self.t if self.fed is None else self.fed.shape[0]
        computed = x.shape[1] - fed
        saved = steps[0].new_empty(1, x.shape[1], width)  # (1, R + K, out)
        with torch.no_grad():
            saved[0, :computed] = apply_linear(x[0, :computed], maps)
        if self.fed is None:  # every position: joined in place
            torch.cat(steps, 1, out=saved[0, computed:].view(n, self.t, width))
        else:
            joined = torch.cat(steps, 1).view(n * self.t, width)  # (n t, out)
            torch.index_select(joined, 0, self.fed, out=saved[0, computed:])  # (K, out)
        params = [p for pair in maps for p in pair]
        return _ReplayedLinear.apply(x, saved, *params)

    def _every_row(self, column: int, step: Tensor) -> Tensor:
        """Step `column`'s outputs (N, 1, out): zeros in the rows it no longer decoded."""
        rows = self.record.rows.get(column)
        if rows is None:
            return step
        return step.new_zeros(self.record.batch, *step.shape[1:]).index_copy_(0, rows, step)


class _ReplayedLinear(torch.autograd.Function):
    """y = concat_i(x W_i^T + b_i), with y given; the backward of those linear maps."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, saved: Tensor, *params: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, *params)
        # `saved` is the replay's own (joined) tensor: returned without a copy (autograd makes
        # the output a view of it); in the maps' dtype (bf16 under CUDA autocast), as F.linear's
        return saved

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, *params = ctx.saved_tensors
        dtype = params[0].dtype  # products in the maps' dtype, as autocast's linear backward
        g = grad.reshape(-1, grad.shape[-1]).to(dtype)  # (M, out)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)  # (M, in)
        needs = ctx.needs_input_grad  # x, saved, then weight and bias of each map
        grad_x, grads, start = None, [], 0
        for k, (weight, bias) in enumerate(zip(params[::2], params[1::2], strict=True)):
            g_i = g[:, start : start + weight.shape[0]]  # (M, out_i)
            start += weight.shape[0]
            gx = g_i @ weight  # (M, in)
            grad_x = gx if grad_x is None else grad_x + gx
            gw = gb = None  # frozen (LoRA's base weights): none
            if needs[2 + 2 * k]:  # in the weight's layout (column-major on CPU), as F.linear's
                gw = (x2.t() @ g_i).t() if weight.stride(0) == 1 else g_i.t() @ x2  # (out_i, in)
            if bias is not None and needs[3 + 2 * k]:
                gb = g_i.sum(0)
            grads += [gw, gb]
        assert grad_x is not None  # a fused map has at least one weight
        return (grad_x.view_as(x).to(x.dtype) if needs[0] else None), None, *grads
