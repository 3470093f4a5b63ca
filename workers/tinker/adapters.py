"""One base model and many peft LoRA adapters on it, one per run, added and dropped at will.

The base model's linear layers are wrapped once by peft; each adapter is a named set of
lora_A / lora_B matrices inside them (peft multi-adapter). A request sets its adapter active
(`active`): only that adapter's matrices take part in the forward and only they require grad,
so a run's outputs and gradients are exactly what they are with no other adapter present.
The base weights are frozen and held once, whatever the number of adapters.

Building, saving and loading an adapter is the model loader's (`workers.models.lora`); this
module holds the runs' adapters on one base and turns a run's `LoraConfig` (the SDK's) into
peft's. Formats: `adapter_state` / `load_adapter_state` are peft's own state dict (adapter name
left out), and `write_peft_dir` writes the directory `PeftModel.from_pretrained(base, dir)` loads.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig as PeftLoraConfig
from torch import nn

from workers.models import lora
from workers.tinker.types import LoraConfig

LORA_ALPHA = 32  # scaling alpha / rank, as Tinker's LoRA (and the LoRA Without Regret study)


def peft_config(config: LoraConfig, layers: dict[str, str], base_path: str) -> PeftLoraConfig:
    """peft's LoraConfig of a run: its module names, or the layers its train_* flags select
    (`layers`: `lora.linear_layers` of the base)."""
    targets = config.target_modules
    if targets is None:
        wanted = {"attn": config.train_attn, "mlp": config.train_mlp,
                  "unembed": config.train_unembed}  # fmt: skip
        targets = sorted(name for name, group in layers.items() if wanted.get(group, False))
    return lora.lora_config(config.rank, LORA_ALPHA, list(targets), 0.0, base_path)


class AdapterStack:
    """The base model (`model`, its own forward) with named LoRA adapters injected."""

    def __init__(self, model: nn.Module, base_path: str) -> None:
        self.model, self.base_path = model, base_path
        self.peft: Any = None  # the PeftModel wrapper, made with the first adapter

    @contextlib.contextmanager
    def _quiet_fork(self, seed: int) -> Iterator[None]:
        """Adapters initialised from `seed` alone: the global RNG is left as it was."""
        device = next(self.model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tied lm_head, adapter names: noted in the docs
            torch.manual_seed(seed)
            yield

    def _target(self) -> nn.Module:
        """What the next adapter goes on: the base, wrapped by peft with the first one."""
        return self.model if self.peft is None else self.peft

    def add(self, name: str, config: PeftLoraConfig, seed: int) -> list[nn.Parameter]:
        """Add adapter `name`, initialised from `seed` alone (the global RNG is untouched)."""
        with self._quiet_fork(seed):
            self.peft = lora.add_lora(self._target(), config, name)
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
        return lora.adapter_state(self.peft, name)

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        lora.load_adapter_state(self.peft, name, state)

    def write_peft_dir(self, name: str, path: Path) -> None:
        """adapter_config.json + adapter_model.safetensors: a peft adapter directory."""
        lora.save_adapter(self.peft, name, path)

    def load_peft_dir(self, name: str, path: Path) -> None:
        """Add adapter `name` from a peft adapter directory (`write_peft_dir`'s or peft's)."""
        with self._quiet_fork(0):
            self.peft = lora.load_adapter(
                self.model if self.peft is None else self.peft, path, name=name
            )
