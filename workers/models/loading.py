"""Loading a base model and its tokenizer, the same way for training, Tinker and serving.

`load_pretrained` loads a `save_pretrained` directory (or Hub id): the weights in the dtype
`dtypes.weights_dtype` chooses for the device and the model's role (frozen or trained), saved
adapters merged in order (a checkpoint's lineage), moved to the device, frozen or not, and on
CPU each weight in memory of its own (`layout`). The tokenizer gets a pad token where it has
none (the end-of-sequence token: batches pad with it, and the attention mask hides it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

# at import, not inside the load: a run measures its peak memory from before it loads a model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

if TYPE_CHECKING:  # a type only: importing it loads modeling_utils before the run's baseline
    from transformers import PreTrainedModel

from workers.models.dtypes import resolve_precision, stored_dtype, weights_dtype
from workers.models.layout import use_cpu_weight_layout


class ModelLoadError(RuntimeError):
    """The weights or the tokenizer could not be loaded; the message says which and why (a job's
    error, a request's 4xx)."""


@dataclass
class Loaded:
    model: Any  # a transformers causal LM
    tokenizer: Any
    stored_dtype: torch.dtype  # the dtype the weights were saved in (what an export is written in)


def ensure_pad_token(tokenizer: Any) -> Any:
    """The tokenizer, with its end-of-sequence token as pad token where it has none."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_pretrained(
    path: str | Path,
    device: str | torch.device,
    *,
    frozen: bool,
    precision: str | None = None,
    dtype: torch.dtype | None = None,
    merge: Sequence[str | Path] = (),
    column_major: bool = False,
    label: str | None = None,
) -> Loaded:
    """The model at `path` and its tokenizer.

    `frozen`: the model only runs forward passes (eval mode, no gradients), so it loads in the
    dtype of frozen weights; otherwise in fp32, every parameter requiring grad. `precision`:
    the run's (None: the device's). `dtype` overrides the rule. `merge`: adapter directories
    folded in, oldest first. `column_major`: the CPU layout of linear weights (`layout`).
    `label`: what the error calls the weights (their path by default).
    """
    if dtype is None:
        dtype = weights_dtype(device, frozen=frozen, precision=resolve_precision(precision, device))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        stored = stored_dtype(AutoConfig.from_pretrained(path))  # before loading in `dtype`
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        if merge:  # peft only when there are adapters: a full-weights job never imports it
            from workers.models.lora import merge_adapters

            model = merge_adapters(model, merge)
    except Exception as exc:  # noqa: BLE001 - any failure here is about these weights
        raise ModelLoadError(f"cannot load {label or repr(str(path))}: {exc}") from exc
    ensure_pad_token(tokenizer)
    # in place, as a Module moves; transformers wraps `to` in functools.wraps, whose stub is no
    # method: mypy would pass `device` as its `self`
    model.to(device)  # type: ignore[arg-type]
    if frozen:
        model.eval()
    model.requires_grad_(not frozen)  # merging froze the base: trained weights train again
    use_cpu_weight_layout(model, column_major=column_major)
    return Loaded(model, tokenizer, stored)
