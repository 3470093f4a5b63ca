"""Checkpoints: the model (or LoRA adapter) and tokenizer via `save_pretrained` (safetensors) at
the directory's root, `trainer_state.pt` (optimizer, scheduler, RNG states, data position, step)
and `spec.json`. A run resumed from one continues exactly where it left off.

A LoRA checkpoint is a peft adapter (`PeftModel.from_pretrained(base, dir)` loads it); with
`lora.export_merged` it also holds `merged/`: the adapter folded into the base weights
(W + (alpha / r) * B A, peft's `merge_and_unload` on a copy), with the tokenizer, loadable by
`AutoModelForCausalLM.from_pretrained(dir / "merged")`.
"""

from __future__ import annotations

import copy
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.grpo.config import TrainSpec

TRAINER_STATE = "trainer_state.pt"
SPEC_FILE = "spec.json"
MERGED_DIR = "merged"


def rng_state(sampler_generator: torch.Generator) -> dict[str, Any]:
    """RNG states of torch, python, numpy and the sampling generator (torch.load-safe types)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "sampler": sampler_generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], sampler_generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    sampler_generator.set_state(state["sampler"])


def save_checkpoint(
    directory: Path, model: Any, tokenizer: Any, spec: TrainSpec, trainer_state: dict[str, Any]
) -> Path:
    """Write the checkpoint into a temporary sibling, then rename it into place."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if spec.lora is not None and spec.lora.export_merged:
        save_merged(model, tokenizer, tmp / MERGED_DIR)
    torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def load_trainer_state(directory: Path) -> dict[str, Any]:
    return torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=True)


def save_merged(model: Any, tokenizer: Any, directory: Path) -> None:
    """Full weights of a peft model with its adapter merged in; the trained model is untouched."""
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    del merged
