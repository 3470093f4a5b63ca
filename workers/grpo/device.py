"""Device choices of a run: the default device and the autocast context of forward passes.

A run's precision (`TrainSpec.precision`; by default bf16 on a CUDA device with bf16 support,
fp32 elsewhere): under bf16, forward passes (sampling, pi_ref / pi_old scoring, the policy's
training forward) run under bf16 autocast while the master weights, gradients, the optimizer
state and the loss stay fp32; under fp32 they run in the weights' dtype.

The precision rule and the CPU weight layout are the model loader's (`workers/models`), imported
here by the engine's modules that choose them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial

import torch

from workers.models.dtypes import resolve_precision
from workers.models.layout import use_cpu_weight_layout

__all__ = [
    "autocast_for",
    "default_device",
    "device_kind",
    "next_device",
    "resolve_precision",
    "use_cpu_weight_layout",
]


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


def autocast_for(
    device: str | torch.device, precision: str | None = None
) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the context a forward pass runs in on `device`."""
    if resolve_precision(precision, device) == "bf16":
        return partial(torch.autocast, torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext
