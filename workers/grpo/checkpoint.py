"""Checkpoints: the model (or LoRA adapter) and tokenizer via `save_pretrained` (safetensors) at
the directory's root, `trainer_state.pt` (optimizer, scheduler, RNG states, data position, step)
and `spec.json`. A run resumed from one continues exactly where it left off.

The final checkpoint (the last step) has no `trainer_state.pt`: nothing is left to resume, and
AdamW's two moments per weight would make it about three times the size of the model. It is
the model, its tokenizer and `spec.json` alone; resuming from it raises `NotResumable`.

A LoRA checkpoint is a peft adapter (`PeftModel.from_pretrained(base, dir)` loads it); with
`lora.export_merged` it also holds `merged/`: the adapter folded into the base weights
(W + (alpha / r) * B A, peft's `merge_and_unload` on a copy), with the tokenizer, loadable by
`AutoModelForCausalLM.from_pretrained(dir / "merged")`.

A run on N > 1 processes writes the same folder (its weights gathered from the shards, so it
loads as above), with the optimizer's shards in `dcp/` (torch.distributed.checkpoint) instead
of inside `trainer_state.pt` (`sharded.py`); it resumes on any number of processes.
"""

from __future__ import annotations

import copy
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.grpo.config import TrainSpec

TRAINER_STATE = "trainer_state.pt"
SPEC_FILE = "spec.json"
SHARDED_DIR = "dcp"
MERGED_DIR = "merged"
_STEP_DIR = re.compile(r"^step-([0-9]+)$")


class NotResumable(ValueError):
    """The directory holds no trainer state (a final checkpoint): it cannot be resumed from."""


def rng_state(sampler_generator: torch.Generator) -> dict[str, Any]:
    """RNG states of torch, python, numpy and the sampling generator (torch.load-safe types)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss],
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
    directory: Path,
    model: Any,
    tokenizer: Any,
    spec: TrainSpec,
    trainer_state: dict[str, Any] | None,
    dtype: torch.dtype = torch.float32,
    *,
    weights: dict[str, torch.Tensor] | None = None,
    sharded: Path | None = None,
) -> Path:
    """Write the checkpoint into a temporary sibling, then rename it into place. Without
    `trainer_state` (the final checkpoint) it is the model, tokenizer and spec alone, in the
    base model's `dtype`; a resumable one keeps the fp32 master weights, to resume exactly.
    `weights`: the model's full state dict when the model itself holds shards; `sharded`: a
    torch.distributed.checkpoint folder moved in as `dcp/`."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if trainer_state is None and dtype != torch.float32:
        _save_as(model, tmp, dtype, weights)
    else:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
    if sharded is not None:
        shutil.move(sharded, tmp / SHARDED_DIR)
    tokenizer.save_pretrained(tmp)
    if spec.lora is not None and spec.lora.export_merged:
        save_merged(model, tokenizer, tmp / MERGED_DIR)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def _save_as(
    model: Any, directory: Path, dtype: torch.dtype, weights: dict[str, torch.Tensor] | None
) -> None:
    """`save_pretrained` with every floating-point tensor in `dtype` (a copy: the model keeps
    its fp32 weights), and the config saying so."""
    weights = model.state_dict() if weights is None else weights
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    model.save_pretrained(directory, safe_serialization=True, state_dict=state)
    if hasattr(model, "get_base_model"):
        return  # an adapter: its base's config is not part of it
    # save_pretrained writes the dtype of the weights in memory (fp32): say what is stored
    previous, model.config.dtype = model.config.dtype, dtype
    try:
        model.config.save_pretrained(directory)
    finally:
        model.config.dtype = previous


def check_resumable(directory: Path) -> None:
    """Raise NotResumable, saying what to do instead, unless `directory` has trainer state."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NotResumable(f"cannot resume from {str(directory)!r}: no such checkpoint directory")
    if not (directory / TRAINER_STATE).is_file():
        raise NotResumable(
            f"cannot resume from {str(directory)!r}: it has no {TRAINER_STATE} (a final"
            " checkpoint holds the trained model alone); resume from a periodic checkpoint,"
            " or start a new run with this directory as base_model"
        )


def load_trainer_state(directory: Path) -> dict[str, Any]:
    check_resumable(directory)
    return torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=True)


def prune_checkpoints(root: Path, keep: int | None, final_step: int) -> list[Path]:
    """Remove all but the newest `keep` periodic `step-N` folders under `root`; the final
    step's folder always stays (TRL's save_total_limit). Returns the removed folders."""
    if keep is None or not root.is_dir():
        return []
    periodic = sorted(
        (int(m.group(1)), path)
        for path in root.iterdir()
        if path.is_dir() and (m := _STEP_DIR.match(path.name)) and int(m.group(1)) != final_step
    )
    removed = [path for _, path in periodic[: max(0, len(periodic) - keep)]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def save_merged(model: Any, tokenizer: Any, directory: Path) -> None:
    """Full weights of a peft model with its adapter merged in; the trained model is untouched."""
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    del merged
