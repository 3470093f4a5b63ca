"""Starting one run's N processes on this machine: PyTorch's elastic launcher (torchrun's).

`launch` runs `entry(*args)` in N processes through `torch.distributed.launcher.elastic_launch`
(a c10d rendezvous on a free local port, no restarts: a rank that fails stops the others, and
the run resumes from its last checkpoint as a one-process run does). Each process then joins the
default process group (`join`: gloo on CPU, NCCL on CUDA, one device per process) and trains
(`distributed.py`). `check_world` refuses a spec that cannot split before any process starts.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

from workers.grpo.config import TrainSpec


class WorldSizeError(ValueError):
    """The spec cannot run on the asked number of processes; the message says why."""


def check_world(spec: TrainSpec, nproc: int) -> None:
    """Raise WorldSizeError unless each of `nproc` processes gets the same whole groups."""
    g = spec.grpo
    if nproc < 1:
        raise WorldSizeError(f"--nproc must be at least 1, not {nproc}")
    if nproc == 1:
        return
    if nproc > g.prompts_per_step:
        raise WorldSizeError(
            f"--nproc {nproc} is more than the step's {g.prompts_per_step} groups"
            " (grpo.prompts_per_step): every process needs at least one whole group"
        )
    if g.prompts_per_step % nproc:
        raise WorldSizeError(
            f"grpo.prompts_per_step = {g.prompts_per_step} groups do not split into whole"
            f" groups across {nproc} processes: make it a multiple of {nproc}"
        )
    if g.skip_zero_std_groups:
        raise WorldSizeError(
            "grpo.skip_zero_std_groups (refilling flat groups) runs on one process only"
        )
    if spec.lora is not None and spec.lora.export_merged:
        raise WorldSizeError("lora.export_merged runs on one process only")


def launch(nproc: int, entry: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """`entry(*args)` on `nproc` local processes; their return values by rank."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"grpo-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as `torchrun --standalone`
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    # As torchrun: one intra-op thread per process unless told, not N processes x all cores.
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    try:
        return elastic_launch(config, entry)(*args)
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)


def join(device: str | None) -> str:
    """Join the launcher's process group; the device this process trains on."""
    import torch
    import torch.distributed as dist

    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group("nccl" if cuda else "gloo")
    return device or "cpu"


def leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
