"""One base model and many peft LoRA adapters on it, one per run, added and dropped at will.

The base model's linear layers are wrapped once by peft; each adapter is a named set of
lora_A / lora_B matrices inside them (peft multi-adapter). A request sets its adapter active
(`active`): only that adapter's matrices take part in the forward and only they require grad,
so a run's outputs and gradients are exactly what they are with no other adapter present.
The base weights are frozen and held once, whatever the number of adapters.

Formats: `adapter_state` / `load_adapter_state` are peft's own state dict (adapter name left
out), and `write_peft_dir` writes the directory `PeftModel.from_pretrained(base, dir)` loads.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from torch import nn

from workers.tinker.types import LoraConfig

LORA_ALPHA = 32  # scaling alpha / rank, as Tinker's LoRA (and the LoRA Without Regret study)


def linear_layers(model: nn.Module) -> dict[str, str]:
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


def peft_config(config: LoraConfig, layers: dict[str, str], base_path: str) -> PeftLoraConfig:
    """peft's LoraConfig of a run: its module names, or the layers its train_* flags select."""
    targets = config.target_modules
    if targets is None:
        wanted = {"attn": config.train_attn, "mlp": config.train_mlp,
                  "unembed": config.train_unembed}  # fmt: skip
        targets = sorted(name for name, group in layers.items() if wanted.get(group, False))
    return PeftLoraConfig(
        r=config.rank,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=list(targets),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )


class AdapterStack:
    """The base model (`model`, its own forward) with named LoRA adapters injected."""

    def __init__(self, model: nn.Module, base_path: str) -> None:
        self.model, self.base_path = model, base_path
        self.peft: Any = None  # the PeftModel wrapper, made with the first adapter

    def add(self, name: str, config: PeftLoraConfig, seed: int) -> list[nn.Parameter]:
        """Add adapter `name`, initialised from `seed` alone (the global RNG is untouched)."""
        device = next(self.model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tied lm_head, adapter names: noted in the docs
            torch.manual_seed(seed)
            if self.peft is None:
                self.peft = get_peft_model(self.model, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
        return self.parameters(name)

    def remove(self, name: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "adapter was active, now deleted": expected
            self.peft.delete_adapter(name)

    def parameters(self, name: str) -> list[nn.Parameter]:
        """The adapter's matrices, always in the same (module) order."""
        tag = f".{name}."
        return [p for n, p in self.model.named_parameters() if tag in n]

    @contextlib.contextmanager
    def active(self, name: str | None) -> Iterator[None]:
        """Forward passes of `self.model` use adapter `name` (None: the base model alone)."""
        if self.peft is None or not self.peft.peft_config:
            yield
            return
        if name is not None:
            self.peft.set_adapter(name)  # its matrices require grad, every other's not
            yield
            return
        self.peft.base_model.disable_adapter_layers()
        try:
            yield
        finally:
            self.peft.base_model.enable_adapter_layers()

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        # the LoRA matrices alone: never the (tied) embedding peft would add for an lm_head target
        state = get_peft_model_state_dict(self.peft, adapter_name=name, save_embedding_layers=False)
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        result = set_peft_model_state_dict(self.peft, state, adapter_name=name)
        missing = [k for k in result.missing_keys if f".{name}." in k]
        if missing or result.unexpected_keys:
            raise ValueError(f"adapter weights do not fit: missing {missing[:3]}, "
                             f"unexpected {list(result.unexpected_keys)[:3]}")  # fmt: skip

    def write_peft_dir(self, name: str, path: Path) -> None:
        """adapter_config.json + adapter_model.safetensors: a peft adapter directory."""
        path.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(self.peft.peft_config[name])
        config.inference_mode = True
        config.save_pretrained(str(path))
        save_file(self.adapter_state(name), str(path / "adapter_model.safetensors"))

    def load_peft_dir(self, name: str, path: Path) -> None:
        """Add adapter `name` from a peft adapter directory (`write_peft_dir`'s or peft's)."""
        self.add(name, PeftLoraConfig.from_pretrained(str(path)), seed=0)
        self.load_adapter_state(name, load_file(str(path / "adapter_model.safetensors")))
