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
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from workers.grpo.config import TrainSpec
from workers.grpo.device import use_cpu_weight_layout


class ModelLoadError(RuntimeError):
    """The base model or tokenizer could not be loaded; the message is shown as the job error."""


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


def _load_base(
    name: str, device: str, what: str = "base_model", adapters: tuple[Path, ...] = ()
) -> tuple[Any, Any, torch.dtype]:
    """The model in fp32 (the master weights), its tokenizer, and the dtype it was saved in."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        stored = _stored_dtype(AutoConfig.from_pretrained(name))  # before fp32 loading
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
        model = _merge_adapters(model, adapters)
    except Exception as exc:  # noqa: BLE001 - any failure here is the user's model path/id
        raise ModelLoadError(f"cannot load {what}: {exc}") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device)
    # each weight in memory of its own (device.py); the backend may re-lay it out (`prepare`)
    use_cpu_weight_layout(model, column_major=False)
    return model, tokenizer, stored


def _merge_adapters(model: Any, adapters: tuple[Path, ...]) -> Any:
    """Fold each adapter into the weights (W + (alpha / r) * B A), oldest first."""
    if not adapters:
        return model
    from peft import PeftModel

    for adapter in adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    for p in model.parameters():  # peft froze the base to load the adapter: these train again
        p.requires_grad_(True)
    return model


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
    load in fp32 (the master copy); under bf16 a frozen reference is kept in bf16."""
    weights = weights or BaseWeights(spec.base_model)
    label = f"base_model {weights.name or weights.path!r}"
    base, tokenizer, save_dtype = _load_base(weights.path, device, label, weights.adapters)
    need_ref = spec.grpo.beta > 0
    if spec.lora is not None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if resume_from is not None:
            model = PeftModel.from_pretrained(base, resume_from, is_trainable=True)
        else:
            cfg = LoraConfig(
                r=spec.lora.r,
                lora_alpha=spec.lora.alpha,
                lora_dropout=spec.lora.dropout,
                target_modules=spec.lora.target_modules,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(base, cfg)
        ref = model if need_ref else None
        return Policy(model, tokenizer, ref, model.disable_adapter, save_dtype)
    ref = (base if resume_from is not None else copy.deepcopy(base)) if need_ref else None
    if ref is not None:
        ref = _frozen(ref)
        if precision == "bf16":  # it only runs forward passes, under bf16 autocast anyway
            ref = ref.to(torch.bfloat16)
    model = base
    if resume_from is not None:
        model, _, _ = _load_base(str(resume_from), device, "the checkpoint to resume from")
    return Policy(model, tokenizer, ref, contextlib.nullcontext, save_dtype)


def _stored_dtype(config: Any) -> torch.dtype:
    """The dtype a model was saved in, from its config (fp32 when it names none)."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
