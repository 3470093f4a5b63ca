"""The dtype rule: trained weights fp32; frozen ones bf16 under bf16 (CUDA's default), fp32 on
CPU unless the run asks for bf16."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from workers.models.dtypes import default_precision, resolve_precision, stored_dtype, weights_dtype


@pytest.mark.parametrize(
    ("device", "frozen", "precision", "want"),
    [
        ("cpu", True, None, torch.float32),  # no fast half-precision kernels: CPU stays fp32
        ("cpu", False, None, torch.float32),
        ("cuda", True, None, torch.bfloat16),  # a frozen base on a GPU: bf16
        ("cuda:1", True, None, torch.bfloat16),
        ("cuda", False, None, torch.float32),  # trained weights are the fp32 master copy
        ("cuda", False, "bf16", torch.float32),
        ("cuda", True, "fp32", torch.float32),  # a run that asks for fp32 gets it
        ("cpu", True, "bf16", torch.bfloat16),  # a run that asks for bf16 on CPU gets it
    ],
)
def test_weights_dtype_by_device_role_and_precision(
    device: str, frozen: bool, precision: str | None, want: torch.dtype
) -> None:
    assert weights_dtype(device, frozen=frozen, precision=precision) == want


def test_default_precision_needs_bf16_support_on_cuda() -> None:
    assert default_precision("cuda") == "bf16"
    assert default_precision("cuda", bf16_supported=False) == "fp32"
    assert default_precision("cpu") == "fp32"
    assert resolve_precision(None, "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"


def test_stored_dtype_reads_the_config() -> None:
    assert stored_dtype(LlamaConfig(dtype="bfloat16")) == torch.bfloat16
    assert stored_dtype(LlamaConfig()) == torch.float32  # names none: fp32
