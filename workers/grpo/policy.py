"""Loading the policy, its tokenizer and the reference policy pi_ref for the KL term.

Full fine-tuning: pi_ref is a frozen copy of the initial weights. LoRA (peft): pi_ref is the same
model with the adapter disabled, so no second copy is held in memory.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.grpo.config import TrainSpec
from workers.grpo.device import use_cpu_weight_layout


class ModelLoadError(RuntimeError):
    """The base model or tokenizer could not be loaded; the message is shown as the job error."""


@dataclass
class Policy:
    model: Any  # the trained model (a peft model with LoRA)
    tokenizer: Any
    reference: Any | None  # the model that computes pi_ref, None when beta == 0
    reference_context: Callable[[], contextlib.AbstractContextManager]  # e.g. adapter disabled


def _load_base(name: str, device: str, what: str = "base_model") -> tuple[Any, Any]:
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - any failure here is the user's model path/id
        raise ModelLoadError(f"cannot load {what} {name!r}: {exc}") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device)
    # each weight in memory of its own (device.py); the backend may re-lay it out (`prepare`)
    use_cpu_weight_layout(model, column_major=False)
    return model, tokenizer


def _frozen(model: Any) -> Any:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_policy(spec: TrainSpec, device: str, resume_from: Path | None = None) -> Policy:
    """The policy to train (from `resume_from` when given) and its reference."""
    base, tokenizer = _load_base(spec.base_model, device)
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
        return Policy(model, tokenizer, ref, model.disable_adapter)
    ref = (base if resume_from is not None else copy.deepcopy(base)) if need_ref else None
    model = base
    if resume_from is not None:
        model, _ = _load_base(str(resume_from), device, "checkpoint")
    return Policy(model, tokenizer, ref and _frozen(ref), contextlib.nullcontext)
