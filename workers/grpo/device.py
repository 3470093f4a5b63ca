"""Device choices of a run: the default device and the autocast context of forward passes.

A run's precision (`TrainSpec.precision`; by default bf16 on a CUDA device with bf16 support,
fp32 elsewhere): under bf16, forward passes (sampling, pi_ref / pi_old scoring, the policy's
training forward) run under bf16 autocast while the master weights, gradients, the optimizer
state and the loss stay fp32; under fp32 they run in the weights' dtype.

On CPU, `use_cpu_weight_layout` can store every linear layer's weight (out, in) column-major:
`F.linear` computes x @ W.T, and with W.T row-major the BLAS runs a plain (NN) product instead of
one with a transposed operand, which is faster for the few-row products of decoding through the
model's own forward. Models the lean decoder covers decode on packed copies instead
(`fast/lean_decode.py`), and there row-major is better: the fused AdamW step copies every
non-contiguous weight's gradient, and packing reads row-major without a copy. Which layout a
run uses is its backend's choice (`Backend.prepare`). Same values, same shapes either way;
gradients and optimizer state follow the layout; checkpoints are written contiguous by
`save_pretrained`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial

import torch


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def next_device(device: torch.device) -> str:
    """The device after `device`, for a generator of its own (`rollout_devices`): the next CUDA
    device; on a CPU the CPU (the same cores, the code path of two devices)."""
    if device.type != "cuda":
        return "cpu"
    index = (device.index or 0) + 1
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"rollout_devices: no CUDA device after {device} (this process sees "
            f"{torch.cuda.device_count()})"
        )
    return f"cuda:{index}"


def device_kind(device: str | torch.device | None = None) -> str:
    """What usage is counted against: `cpu`, or `cuda:<device name>` (`cuda:NVIDIA H200`)."""
    dev = torch.device(device or default_device())
    if dev.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return dev.type


def resolve_precision(precision: str | None, device: str | torch.device) -> str:
    """The spec's precision, or the device's default: bf16 where CUDA supports it."""
    if precision is not None:
        return precision
    cuda = torch.device(device).type == "cuda"
    return "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"


def autocast_for(
    device: str | torch.device, precision: str | None = None
) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the context a forward pass runs in on `device`."""
    if resolve_precision(precision, device) == "bf16":
        return partial(torch.autocast, torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def use_cpu_weight_layout(model: torch.nn.Module, column_major: bool = True) -> None:
    """With `column_major`, store linear weights so (see the module docstring); embeddings
    keep their rows.

    Every CPU parameter is copied into memory of its own, so the mapping of the checkpoint file
    that `from_pretrained` reads weights through is released: its pages, touched by the copies,
    would otherwise stay in the resident set for the whole run.
    """
    embedding = model.get_input_embeddings()
    tied = embedding.weight if embedding is not None else None
    linear = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight is not tied and m.weight.dim() == 2
    }
    with torch.no_grad():
        for param in model.parameters():
            if param.device.type != "cpu":
                continue
            if column_major and id(param) in linear and param.is_contiguous():
                param.data = param.data.t().contiguous().t()
            else:
                param.data = param.data.clone()
