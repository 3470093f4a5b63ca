"""What a Tinker request of each kind does on the engine (`HANDLERS`): the base models' hosts
(workers/tinker/host.py, loaded at a model's first request), the runs on them, and the
checkpoints each save stores and each load unpacks. The tinker worker (`worker.py`) claims,
leases and records; this is the work between.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from service.core.db import session_scope
from service.core.ids import new_id
from service.models import CatalogModel, TinkerRequest, TinkerRun, TinkerSession
from service.settings import Settings
from service.storage import ObjectStorage
from service.storage.archive import extract_tar
from service.tinker import checkpoints
from service.tinker.service import tinker_path
from workers.tinker.types import Deadline

if TYPE_CHECKING:
    from workers.tinker.host import LoraHost

# Requests that change a run's state: once one is done, the run cannot be re-created empty.
STATEFUL = ("forward_backward", "optim_step", "load_weights")


class RunLost(RuntimeError):
    """The run's in-memory state is gone (its worker restarted, or lost a request's lease)."""


def _only(cls: type, values: dict[str, Any]) -> Any:
    """A dataclass of the engine's from a dict, keeping the fields it has."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _run_id(row: TinkerRequest) -> str:
    """The training run a request acts on (every kind but `sample` names one)."""
    if row.run_id is None:
        raise LookupError(f"this {row.kind} request names no training run")
    return row.run_id


class RequestKinds:
    """The engine's side of the tinker worker: one host per base model, the request kinds."""

    settings: Settings
    device: str | None  # None: CUDA when present, at first use
    storage: ObjectStorage
    root: Path  # the worker's folder: base models' run state, unpacked checkpoints, scratch
    hosts: dict[str, LoraHost]  # base model name -> its host
    loading_s: float  # of the request running: loading a base model, not its own work

    def _host(self, base_model: str) -> LoraHost:
        host = self.hosts.get(base_model)
        if host is None:
            loading = time.monotonic()
            import torch

            from service.training.weights import model_path
            from workers.tinker.host import LoraHost

            if self.device is None:
                self.device = "cuda" if torch.cuda.is_available() else "cpu"
            with session_scope() as session:
                model = session.get(CatalogModel, base_model)
                if model is None:
                    raise LookupError(f"model '{base_model}' left the catalog")
                weights = model_path(model, self.settings)
            state = self.root / "state" / base_model
            state.mkdir(parents=True, exist_ok=True)
            host = LoraHost(weights, device=self.device, state_dir=state,
                            max_resident_runs=self.settings.tinker_max_resident_runs)  # fmt: skip
            self.hosts[base_model] = host
            self.loading_s += time.monotonic() - loading
        return host

    def _run(self, row: TinkerRequest) -> LoraHost:
        """The run's host, the run created on it at its first request. A run this worker does
        not hold but that has trained (a worker restarted since) is not silently re-initialised:
        its request fails, and `load_state` from a checkpoint brings it back."""
        from workers.tinker.types import LoraConfig

        host, run_id = self._host(row.base_model), _run_id(row)
        if not host.has_run(run_id):
            with session_scope() as session:
                run = session.get(TinkerRun, run_id)
                config = dict(run.lora_config) if run else {}
                trained = session.scalar(
                    select(TinkerRequest.seq).where(
                        TinkerRequest.run_id == run_id,
                        TinkerRequest.status == "done",
                        TinkerRequest.kind.in_(STATEFUL),
                    )
                )
            if not config:
                raise LookupError(f"run {run_id} is gone")
            if trained is not None and row.kind != "load_weights":
                raise RunLost(
                    "this run's adapter and optimiser state were lost (its tinker worker "
                    "restarted, or lost the lease of one of its requests): load_state from one "
                    "of its checkpoints to go on"
                )
            host.create_run(run_id, _only(LoraConfig, config))
        return host

    def _forward(
        self, row: TinkerRequest, after: list[Any], backward: bool = False
    ) -> dict[str, Any]:
        from workers.tinker.types import Datum

        host = self._run(row)
        data = [_only(Datum, d) for d in row.payload["data"]]
        step = host.forward_backward if backward else host.forward
        p = row.payload
        deadline = Deadline.after(self.settings.tinker_request_timeout_s)  # the host is loaded
        out = step(_run_id(row), data, p["loss_fn"], p.get("loss_fn_config"), deadline)
        return dataclasses.asdict(out)

    def _forward_backward(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        return self._forward(row, after, backward=True)

    def _optim_step(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        from workers.tinker.types import AdamParams

        metrics = self._run(row).optim_step(_run_id(row), _only(AdamParams, row.payload["adam"]))
        return {"type": "optim_step", "metrics": metrics}

    def _sample(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        from workers.tinker.types import SamplingParams

        p = row.payload
        weights = self._unpacked(p["weights"]) if p.get("weights") else None
        result = self._host(row.base_model).sample(
            str(weights) if weights else None,
            p["prompt"],
            p["num_samples"],
            _only(SamplingParams, p["params"]),
            prompt_logprobs=p["prompt_logprobs"],
            deadline=Deadline.after(self.settings.tinker_request_timeout_s),
        )
        return dataclasses.asdict(result)

    def _save_weights(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        path = self._save(row, after, "training", self._run(row).save_state)
        return {"type": "save_weights", "path": path}

    def _save_for_sampler(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        path = self._save(row, after, "sampler", self._run(row).save_for_sampler)
        out: dict[str, Any] = {"type": "save_weights_for_sampler", "path": path}
        if row.payload.get("sampling_session"):
            sampler = TinkerSession(
                id=new_id("tks"),
                tenant_id=row.tenant_id,
                kind="sampler",
                base_model=row.base_model,
                model_path=path,
                session_id=row.payload.get("session_id"),  # its run's session
            )
            after.append(sampler)
            out["sampling_session_id"] = sampler.id
        return out

    def _load_weights(self, row: TinkerRequest, after: list[Any]) -> dict[str, Any]:
        p, run_id = row.payload, _run_id(row)
        host = self._run(row)
        host.load_state(run_id, self._unpacked(p), with_optimizer=bool(p["optimizer"]))
        return {"type": "load_weights", "path": p["path"], "model_id": run_id}

    # Storage

    def _save(
        self, row: TinkerRequest, after: list[Any], kind: str, write: Callable[[str, Path], None]
    ) -> str:
        """The checkpoint stored (within the tenant's cap), its row written with the outcome."""
        if row.run_id is None:  # the API queues a save on its run
            raise LookupError("a save without its run")
        ckpt = checkpoints.store(self.storage, self.settings, self._scratch(), row.run_id,
                                 row.tenant_id, kind, row.payload, write)  # fmt: skip
        after.append(ckpt)
        return tinker_path(row.run_id, kind, ckpt.name)

    def _unpacked(self, ref: dict[str, Any]) -> Path:
        """A stored checkpoint unpacked on this machine (once: they never change)."""
        target = self.root / "checkpoints" / ref["checkpoint_id"]
        if not target.is_dir():
            work = Path(tempfile.mkdtemp(prefix="unpack-", dir=self._scratch()))
            try:
                self.storage.download_file(ref["object_key"], work / "ckpt.tar")
                extract_tar(work / "ckpt.tar", work / "dir")
                target.parent.mkdir(parents=True, exist_ok=True)
                (work / "dir").rename(target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return target

    def _scratch(self) -> Path:
        scratch = self.root / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch


# What the worker runs for each request kind (`futures.submit`'s): the handler gets the request
# and the list of rows to write with its outcome, and returns the future's result.
HANDLERS: dict[str, Callable[[RequestKinds, TinkerRequest, list[Any]], dict[str, Any]]] = {
    "forward": RequestKinds._forward,
    "forward_backward": RequestKinds._forward_backward,
    "optim_step": RequestKinds._optim_step,
    "sample": RequestKinds._sample,
    "save_weights": RequestKinds._save_weights,
    "save_for_sampler": RequestKinds._save_for_sampler,
    "load_weights": RequestKinds._load_weights,
}
