"""Device choices of a run: the default device and the autocast context of forward passes.

On CUDA with bf16 support, forward passes (sampling, pi_ref / pi_old scoring, the policy's
training forward) run under bf16 autocast while the master weights, the optimizer state and the
loss stay fp32. On CPU (and older GPUs) forward passes run in the weights' dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial

import torch


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def autocast_for(device: str | torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the context a forward pass runs in on `device`."""
    if torch.device(device).type == "cuda" and torch.cuda.is_bf16_supported():
        return partial(torch.autocast, "cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext
