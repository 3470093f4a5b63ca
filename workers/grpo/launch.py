"""Starting one run's N processes on this machine: PyTorch's elastic launcher (torchrun's).

`launch` runs `entry(*args)` in N processes through `torch.distributed.launcher.elastic_launch`
(a c10d rendezvous on a free local port, no restarts: a rank that fails stops the others, and
the run resumes from its last checkpoint as a one-process run does). The ranks are forked from
the standard library's forkserver, which imports torch and the engine once (`PRELOAD`) instead
of each rank importing them in a fresh interpreter; the server only imports, so a rank is the
first process to touch CUDA, as with `spawn`. Each process then joins the
default process group (`join`: gloo on CPU, NCCL on CUDA, one device per process) and trains
(`distributed.py`). `world.check_world` refuses a spec that cannot split before any process
starts.

A rank's own error (not a collective whose peer is gone) is told to the launcher through
torch elastic's error file (TORCHELASTIC_ERROR_FILE, the one `@record` writes, in its format)
with the run's classification of it added (`record_error`); the launcher's caller reads back
every rank's file from the launch's log folder (`recorded_error`), so an error on any rank can
end the run as it would on rank 0, where a rank that died (a signal, an OOM kill) wrote none.
Every rank's, not only the failures the `ChildFailedError` lists: the launcher lists the first
it saw exit, and the rank whose error broke a collective may exit after the peer it broke.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.grpo.world import WorldSizeError, check_world

__all__ = [
    "WorldSizeError",
    "check_world",
    "join",
    "launch",
    "leave",
    "peer_lost",
    "record_error",
    "recorded_error",
]
_KIND = "grpoError"  # our key in the error file's extraInfo (torch's own keys are camelCase)
# What every rank imports, imported once by the forkserver (none of it asks anything of CUDA
# at import: tests/workers/grpo/test_distributed.py checks it).
PRELOAD = ("torch.distributed", "workers.grpo.trainer")


def launch(
    nproc: int,
    entry: Callable[..., Any],
    *args: Any,
    shutdown_timeout: int = 30,
    log_dir: str | None = None,
) -> dict[int, Any]:
    """`entry(*args)` on `nproc` local processes; their return values by rank. SIGTERM to this
    process goes on to every rank (the launcher's own handling, as torchrun's), which then has
    `shutdown_timeout` seconds to end before it is killed. The ranks' error files go under
    `log_dir` (a temporary folder when None), where `recorded_error` reads them."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
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
        start_method="forkserver",
        shutdown_timeout=shutdown_timeout,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    # Takes effect when this process first starts the server; the entry's own module too.
    extra = [] if entry.__module__ == "__main__" else [entry.__module__]
    multiprocessing.get_context("forkserver").set_forkserver_preload([*PRELOAD, *extra])
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


def record_error(exc: BaseException, kind: dict[str, Any]) -> bool:
    """Write this rank's error, classified (`kind`: JSON, e.g. the job's error code and
    message), to the launcher's error file; False when this process has none (not launched).
    The rank then exits non-zero without raising, so `@record` keeps the file as written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    info = {
        "py_callstack": "".join(traceback.format_exception(exc)),
        "timestamp": str(int(time.time())),
        _KIND: kind,
    }
    data = {"message": {"message": f"{type(exc).__name__}: {exc}", "extraInfo": info}}
    with open(path, "w") as fh:
        json.dump(data, fh)
    return True


def recorded_error(log_dir: str | Path) -> tuple[int, dict[str, Any]] | None:
    """Of a failed launch whose ranks wrote their error files under `log_dir`, the first rank
    (lowest) that recorded a classified error, and that error; None when every failed rank died
    or failed unclassified."""
    found: dict[int, dict[str, Any]] = {}
    # torch elastic's layout: <log_dir>/<run id>_<random>/attempt_<n>/<local rank>/error.json
    for path in Path(log_dir).glob("*/attempt_*/*/error.json"):
        try:
            message = json.loads(path.read_text()).get("message")
            rank = int(path.parent.name)
        except (OSError, ValueError, AttributeError):  # a rank killed while writing it
            continue
        if isinstance(message, dict) and isinstance(message.get("extraInfo"), dict):
            kind = message["extraInfo"].get(_KIND)
            if isinstance(kind, dict):
                found[rank] = kind
    return min(found.items()) if found else None
