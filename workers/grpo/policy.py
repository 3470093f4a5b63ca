"""Loading the policy, its tokenizer and the reference policy pi_ref for the KL term.

Full fine-tuning: pi_ref is a frozen copy of the initial weights. LoRA (peft): pi_ref is the same
model with the adapter disabled, so no second copy is held in memory.

The initial weights are a model directory (or Hub id) with, when a job fine-tunes from an
adapter checkpoint, LoRA adapters merged into it in order (`BaseWeights`): the merged weights
are this job's starting point and its pi_ref.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workers.grpo.config import TrainSpec
from workers.models.dtypes import weights_dtype
from workers.models.loading import ModelLoadError, load_pretrained

__all__ = ["BaseWeights", "ModelLoadError", "Policy", "load_policy"]


@dataclass(frozen=True)
class BaseWeights:
    """Where a job's starting weights come from."""

    path: str  # a `save_pretrained` directory (or Hub id) with the model and its tokenizer
    adapters: tuple[Path, ...] = ()  # peft adapters merged into it, oldest first
    name: str | None = None  # what errors call it (the tenant's `base_model`), not the path


@dataclass
class Policy:
    model: Any  # the trained model (a peft model with LoRA)
    tokenizer: Any
    reference: Any | None  # the model that computes pi_ref, None when beta == 0
    reference_context: Callable[[], contextlib.AbstractContextManager]  # e.g. adapter disabled
    save_dtype: torch.dtype = torch.float32  # the base model's own dtype: the final export's


def _frozen(model: Any) -> Any:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_policy(
    spec: TrainSpec,
    device: str,
    resume_from: Path | None = None,
    weights: BaseWeights | None = None,
    precision: str = "fp32",
) -> Policy:
    """The policy to train (from `resume_from` when given) and its reference. The weights
    load in fp32: the master copy, and under LoRA the frozen base too (the adapter is merged
    into it for the export, in fp32 before the cast to the saved dtype). Under bf16 a frozen
    full-weights reference is kept in the frozen weights' dtype (`weights_dtype`: bf16)."""
    weights = weights or BaseWeights(spec.base_model)
    label = f"base_model {weights.name or weights.path!r}"
    # each weight in memory of its own (layout.py); the backend may re-lay it out (`prepare`)
    base = load_pretrained(weights.path, device, frozen=False, merge=weights.adapters, label=label)
    tokenizer, save_dtype = base.tokenizer, base.stored_dtype
    need_ref = spec.grpo.beta > 0
    if spec.lora is not None:
        from workers.models import lora  # peft: LoRA jobs only

        if resume_from is not None:
            model = lora.load_adapter(base.model, resume_from, trainable=True)
        else:
            cfg = lora.lora_config(spec.lora.r, spec.lora.alpha, spec.lora.target_modules,
                                   spec.lora.dropout)  # fmt: skip
            model = lora.add_lora(base.model, cfg)
        ref = model if need_ref else None
        return Policy(model, tokenizer, ref, model.disable_adapter, save_dtype)
    model = base.model
    ref = (model if resume_from is not None else copy.deepcopy(model)) if need_ref else None
    if ref is not None:  # it only runs forward passes, under bf16 autocast anyway
        ref = _frozen(ref).to(weights_dtype(device, frozen=True, precision=precision))
    if resume_from is not None:
        what = "the checkpoint to resume from"
        model = load_pretrained(str(resume_from), device, frozen=False, label=what).model
    return Policy(model, tokenizer, ref, contextlib.nullcontext, save_dtype)
