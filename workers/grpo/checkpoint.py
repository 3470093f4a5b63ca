"""Checkpoints: the model (or LoRA adapter) and tokenizer via `save_pretrained` (safetensors) at
the directory's root, `trainer_state.pt` (optimizer, scheduler, RNG states, data position, step)
and `spec.json`. A run resumed from one continues exactly where it left off.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.grpo.config import TrainSpec

TRAINER_STATE = "trainer_state.pt"
SPEC_FILE = "spec.json"


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
    torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def load_trainer_state(directory: Path) -> dict[str, Any]:
    return torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=True)
