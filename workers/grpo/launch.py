"""Starting one run's N processes on this machine: PyTorch's elastic launcher (torchrun's).

`launch` runs `entry(*args)` in N processes through `torch.distributed.launcher.elastic_launch`
(a c10d rendezvous on a free local port, no restarts: a rank that fails stops the others, and
the run resumes from its last checkpoint as a one-process run does). Each process then joins the
default process group (`join`: gloo on CPU, NCCL on CUDA, one device per process) and trains
(`distributed.py`). `world.check_world` refuses a spec that cannot split before any process
starts.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

from workers.grpo.world import WorldSizeError, check_world

__all__ = ["WorldSizeError", "check_world", "join", "launch", "leave", "peer_lost"]


def launch(
    nproc: int, entry: Callable[..., Any], *args: Any, shutdown_timeout: int = 30
) -> dict[int, Any]:
    """`entry(*args)` on `nproc` local processes; their return values by rank. SIGTERM to this
    process goes on to every rank (the launcher's own handling, as torchrun's), which then has
    `shutdown_timeout` seconds to end before it is killed."""
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
        shutdown_timeout=shutdown_timeout,
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


# What gloo and NCCL say when the process at the other end of a collective is gone.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "NCCL", "ProcessGroup")


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` came from a collective whose peer process died (another rank crashed or
    was killed): the fault is that rank's, not this one's, so the run's outcome is not this
    exception. gloo raises a plain RuntimeError naming its transport."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _PEER_GONE)


def leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
