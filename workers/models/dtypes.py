"""The dtype a model's weights load in: by device, by precision and by whether they train.

Trained weights are a master copy and stay fp32 everywhere (a bf16 run trains under autocast;
its weights, gradients and Adam state are fp32). Frozen weights (a served model, GRPO's
full-weights reference, Tinker's base under its LoRA adapters) only run forward passes: under
bf16 they load in bf16, half the memory, the precision the autocast would compute in anyway.
A precision not given is the device's: bf16 on CUDA (where it supports it), fp32 elsewhere;
on CPU there are no fast half-precision kernels, and its numbers stay fp32.
"""

from __future__ import annotations

from typing import Any

import torch


def default_precision(device: str | torch.device, bf16_supported: bool = True) -> str:
    """The precision a device runs in unless told: bf16 on CUDA with bf16 support, else fp32."""
    return "bf16" if torch.device(device).type == "cuda" and bf16_supported else "fp32"


def resolve_precision(precision: str | None, device: str | torch.device) -> str:
    """The spec's precision, or the device's default: bf16 where CUDA supports it."""
    if precision is not None:
        return precision
    cuda = torch.device(device).type == "cuda"
    return default_precision(device, cuda and torch.cuda.is_bf16_supported())


def weights_dtype(
    device: str | torch.device, *, frozen: bool, precision: str | None = None
) -> torch.dtype:
    """fp32 for weights that train; for frozen ones, bf16 under bf16 precision (`precision`,
    or the device's default without asking the hardware), fp32 otherwise. Pure: callers that
    must ask the hardware pass `resolve_precision(None, device)`."""
    if not frozen:
        return torch.float32
    precision = precision or default_precision(device)
    return torch.bfloat16 if precision == "bf16" else torch.float32


def stored_dtype(config: Any) -> torch.dtype:
    """The dtype a model was saved in, from its config (fp32 when it names none): what a
    final export is written in, whatever the dtype it trained in."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
