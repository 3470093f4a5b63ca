"""LoRA adapters (peft) on a loaded model: built from the caller's numbers, saved, loaded,
chained and merged, the same way for GRPO training, the Tinker host and serving.

An adapter adds (alpha / rank) * B A to each targeted linear layer's weight, A (rank, in)
random, B (out, rank) zero, so a new adapter leaves the model's outputs as they were. The
rank, alpha, target modules and dropout are always the caller's: GRPO's from the job's
`lora`, Tinker's from the run's `LoraConfig` (its alpha fixed by the SDK's convention).

A saved adapter is a peft adapter directory (adapter_config.json, adapter_model.safetensors):
`load_adapter` loads one (several, by name, on one base), `merge_adapters` folds a chain of
them into the weights, oldest first. The saved state holds the LoRA matrices only, never the
(tied) embedding peft would add for an lm_head target.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from safetensors.torch import save_file
from torch import nn

if TYPE_CHECKING:  # types only: importing them loads modeling_utils before a run's baseline
    from torch.nn.modules.module import _IncompatibleKeys
    from transformers import PreTrainedModel


def lora_config(
    rank: int,
    alpha: float,
    targets: str | Sequence[str] | None,
    dropout: float = 0.0,
    base_path: str | None = None,
) -> LoraConfig:
    """peft's config of a causal-LM LoRA. `targets`: module names, "all-linear", or None
    (peft's defaults for the architecture)."""
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft says int; it only divides it by r
        lora_dropout=dropout,
        target_modules=targets if targets is None or isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )


def add_lora(model: nn.Module, config: LoraConfig, name: str = "default") -> PeftModel:
    """A new adapter `name` on `model` (wrapped by peft the first time, its base frozen); the
    global random state draws its A matrices. Returns the peft model."""
    if isinstance(model, PeftModel):
        model.add_adapter(name, config)
        return model
    return get_peft_model(model, config, adapter_name=name)


def load_adapter(
    model: nn.Module, path: str | Path, *, name: str = "default", trainable: bool = False
) -> PeftModel:
    """Adapter `name` from a peft adapter directory, on `model` (a plain model is wrapped, a
    peft model gains one more adapter). Not `trainable`: its matrices require no grad."""
    if isinstance(model, PeftModel):
        model.load_adapter(str(path), adapter_name=name, is_trainable=trainable)
        return model
    return PeftModel.from_pretrained(model, str(path), adapter_name=name, is_trainable=trainable)


def merge_adapters(model: PreTrainedModel, paths: Iterable[str | Path]) -> PreTrainedModel:
    """Fold each adapter into the weights (W + (alpha / r) * B A), oldest first: the plain
    model of the lineage. peft freezes the base to load an adapter: the caller sets which
    parameters train afterwards (`loading.load_pretrained` does)."""
    for path in paths:
        # peft types the unwrapped model as any Module; it is the model it wrapped
        model = cast("PreTrainedModel", load_adapter(model, path).merge_and_unload())
    return model


def adapter_state(model: PeftModel, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s matrices by peft's names (the adapter name left out), on the CPU."""
    state = get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False)
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}


def load_adapter_state(model: PeftModel, name: str, state: dict[str, torch.Tensor]) -> None:
    """Set adapter `name`'s matrices from `adapter_state`'s dict; one missing or unexpected
    is a ValueError (peft only warns), so a state of another shape never half-loads."""
    # peft annotates the result as `namedtuple`: it is torch's `load_state_dict` result
    result = cast("_IncompatibleKeys", set_peft_model_state_dict(model, state, adapter_name=name))
    missing = [k for k in result.missing_keys if f".{name}." in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"adapter weights do not fit: missing {missing[:3]}, "
                         f"unexpected {list(result.unexpected_keys)[:3]}")  # fmt: skip


def save_adapter(model: PeftModel, name: str, path: str | Path) -> None:
    """adapter_config.json + adapter_model.safetensors: the directory `load_adapter` loads."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.peft_config[name])
    config.inference_mode = True
    config.save_pretrained(str(path))
    save_file(adapter_state(model, name), str(path / "adapter_model.safetensors"))


def linear_layers(model: PreTrainedModel) -> dict[str, str]:
    """Every linear layer's qualified name -> its group: attn, mlp, unembed, other, or tied (an
    unembedding that shares its weight with the embedding: no adapter goes there, since merging
    one would change the embedding too and the merged model would differ from the adapter's)."""
    out_emb = model.get_output_embeddings()
    tied = out_emb is not None and out_emb.weight is model.get_input_embeddings().weight
    groups = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if module is out_emb:
            groups[name] = "tied" if tied else "unembed"
        elif "attn" in name or "attention" in name:
            groups[name] = "attn"
        elif "mlp" in name or "feed_forward" in name:
            groups[name] = "mlp"
        else:
            groups[name] = "other"
    return groups
