"""Checkpoints of a run on N > 1 processes, through torch.distributed.checkpoint (DCP).

The folder is the single-process one (`checkpoint.py`): the model gathered from its FSDP2 shards
into one state dict (`get_model_state_dict(full_state_dict=True)`, on process 0) and written by
`save_pretrained`, so a download loads with `from_pretrained` as before; the tokenizer, the
spec and `trainer_state.pt` (step, scheduler, data position, RNG states: the same on every
process). The optimizer state (AdamW's two moments per trained weight, most of the bytes) is
not gathered: each process writes its shards into `dcp/` with `dcp.save`, which records how
they tile the full tensors. `load_optimizer` reads it back on any number of processes, one
included (`dcp.load` reshards to what the model in memory holds): a run checkpointed on 2
processes resumes on 1 or 4. A single-process checkpoint resumes on N processes too: its full
optimizer state is sharded on load (`set_optimizer_state_dict(full_state_dict=True)`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from workers.grpo.checkpoint import SHARDED_DIR, save_checkpoint
from workers.grpo.config import TrainSpec

Save = Callable[[Path, Any, Any, TrainSpec, dict[str, Any] | None, torch.dtype], Path]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def save_sharded(optimizer: torch.optim.Optimizer) -> Save:
    """`checkpoint.save_checkpoint`'s signature, called by every process (it gathers)."""

    def save(
        directory: Path,
        model: Any,
        tokenizer: Any,
        spec: TrainSpec,
        trainer_state: dict[str, Any] | None,
        dtype: torch.dtype = torch.float32,
    ) -> Path:
        directory, first = Path(directory), dist.get_rank() == 0
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        # a model's state dict holds tensors alone (torch types it as any state dict's values)
        gathered = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
        weights = _tied(gathered, model)  # {} but on 0
        staging = None
        if trainer_state is not None:  # the final checkpoint is the model alone
            staging = directory.with_name(directory.name + ".dcp")
            if first:
                shutil.rmtree(staging, ignore_errors=True)
            dist.barrier()
            state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
            dcp.save(state, checkpoint_id=staging)
        if first:
            save_checkpoint(directory, model, tokenizer, spec, trainer_state, dtype,
                            weights=weights, sharded=staging)  # fmt: skip
        dist.barrier()  # no process goes on (to prune, upload, resume) before it is in place
        return directory

    return save


def _tied(weights: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """Tied weights (embeddings and head) as one tensor again: gathered, each name got its own
    copy, and `save_pretrained` drops a tied name only when its tensor is shared."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), name)
        if owner != name and owner in weights and name in weights:
            weights[name] = weights[owner]
    return weights


def load_optimizer(
    directory: Path, state: dict[str, Any], model: Any, optimizer: torch.optim.Optimizer
) -> None:
    """The optimizer state of a checkpoint, from either kind, into this run's optimizer."""
    if "optimizer" in state and not _distributed():
        optimizer.load_state_dict(state["optimizer"])  # one process to one process: as ever
        return
    if "optimizer" in state:  # a single-process checkpoint: sharded as it loads
        full = _by_name(state["optimizer"], model)
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, full, options=options)
        return
    target = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the shapes to fill
    dcp.load(target, checkpoint_id=Path(directory) / SHARDED_DIR)
    set_optimizer_state_dict(model, optimizer, target["optimizer"])


def _by_name(saved: dict[str, Any], model: Any) -> dict[str, Any]:
    """A `torch.optim` state dict (parameters by position) keyed by parameter name, as
    `set_optimizer_state_dict` reads it; the positions are the trained parameters in order."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state = {names[i]: v for i, v in saved["state"].items()}
    groups = [g | {"params": [names[i] for i in g["params"]]} for g in saved["param_groups"]]
    return {"state": state, "param_groups": groups}
