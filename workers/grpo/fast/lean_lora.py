"""LoRA adapters (peft) in the lean forward: merged into the weights, or as low-rank updates.

A plain LoRA linear layer (no DoRA or other variant, no LoRA bias, no dropout at work) computes
base(x) + s (x A^T) B^T for each active adapter. The decode loop merges s B A into the weights
once per call (its weights are fused and packed copies anyway); scoring and training apply the
update in factored form, so that autograd gives A and B their gradients through two thin
products, as peft's own forward does, with no weight-sized copy or product. With the adapters
disabled (pi_ref) or merged by peft, a layer is its base layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class LowRank:
    """scale * (x a^T) b^T: one adapter's update of one linear map."""

    a: Tensor  # (r, in)
    b: Tensor  # (out, r)
    scale: float


def is_lora(module: Any) -> bool:
    return hasattr(module, "get_delta_weight") and hasattr(module, "lora_A")


def is_plain_lora(module: Any) -> bool:
    """A peft LoRA linear layer whose output is base(x) + s (x A^T) B^T, over an `nn.Linear`."""
    if not is_lora(module):
        return False
    return (
        type(module.get_base_layer()) is nn.Linear
        and not getattr(module, "lora_variant", {})
        and not any(getattr(module, "lora_bias", {}).values())
        and all(
            isinstance(module.lora_dropout[a], nn.Identity) or not module.lora_dropout[a].training
            for a in _adapters(module)
        )
    )


def _adapters(module: Any) -> list[str]:
    """The adapters whose update the layer adds now (none when disabled or merged)."""
    if module.disable_adapters or module.merged:
        return []
    return [a for a in module.active_adapters if a in module.lora_A]


def merged(module: Any) -> tuple[Tensor, Tensor | None]:
    """Weight and bias a linear layer multiplies by, adapters' s B A added in."""
    if not is_lora(module):
        return module.weight, module.bias
    base = module.get_base_layer()
    weight = base.weight
    for adapter in _adapters(module):
        weight = weight + module.get_delta_weight(adapter)
    return weight, base.bias


def factored(module: Any) -> tuple[Tensor, Tensor | None, list[LowRank]]:
    """The base weight and bias, and each active adapter's update."""
    if not is_lora(module):
        return module.weight, module.bias, []
    base = module.get_base_layer()
    updates = [
        LowRank(module.lora_A[a].weight, module.lora_B[a].weight, module.scaling[a])
        for a in _adapters(module)
    ]
    return base.weight, base.bias, updates


def low_rank_outputs(x: Tensor, updates: list[list[LowRank]], widths: list[int]) -> Tensor:
    """The updates of maps of widths `widths` (outputs concatenated) for input x (..., in)."""
    parts: list[Tensor] = []
    for map_updates, width in zip(updates, widths, strict=True):
        part = x.new_zeros(*x.shape[:-1], width) if not map_updates else None
        for u in map_updates:
            y = (x @ u.a.to(x.dtype).t()) @ u.b.to(x.dtype).t() * u.scale  # (..., width)
            part = y if part is None else part + y
        assert part is not None  # zeros, or the first update's product
        parts.append(part)
    return parts[0] if len(parts) == 1 else torch.cat(parts, -1)
