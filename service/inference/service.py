"""The API's side of inference: which weights a tenant's `model` names (a catalog model, or one
of the tenant's checkpoints; another tenant's is a 404 exactly as a missing one), what the
backend is asked for, and the backend's answers (errors become problems).

Backends: `grpo` (`grpo-service serve`) resolves the same id from the database itself;
`openai` (vLLM, SGLang) serves catalog models under their catalog names, and adapter
checkpoints once they are unpacked under `GRPO_INFERENCE_LORA_DIR` (a folder the backend reads
too, at `GRPO_INFERENCE_LORA_BACKEND_DIR` when it mounts it elsewhere) and loaded through its
`/v1/load_lora_adapter` under their checkpoint id.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from service.catalog.fine_tuned import PREFIX as FINE_TUNED_PREFIX
from service.catalog.fine_tuned import find_fine_tuned
from service.catalog.service import find_model, find_tenant_checkpoint
from service.core.problems import ProblemError, model_not_found
from service.models import Checkpoint, TinkerCheckpoint
from service.settings import Settings
from service.storage import ObjectStorage
from service.storage.archive import extract_tar
from service.tinker.service import find_sampler


@dataclass(frozen=True)
class Target:
    """What the backend is asked to run: `model` as it knows it."""

    model: str
    # openai backend: an adapter checkpoint (a job's, or a Tinker run's sampler weights) to load
    adapter: Checkpoint | TinkerCheckpoint | None = None
    lineage: bool = False  # the adapter sits on other checkpoints (merged at load)
    full: bool = False  # a full-weights checkpoint


def resolve(session: Session, tenant_id: str, model: str) -> Target:
    """A fine-tuned model's name (`ft:…`, service.catalog.fine_tuned) is its job's final
    checkpoint: the backend is asked for that checkpoint's id."""
    if model.startswith(("ckpt_", FINE_TUNED_PREFIX)):
        if model.startswith(FINE_TUNED_PREFIX):
            found = find_fine_tuned(session, tenant_id, model)
        else:
            found = find_tenant_checkpoint(session, tenant_id, model)
        if found is None:
            raise model_not_found(model)
        ckpt, job = found
        session.expunge(ckpt)
        return Target(
            ckpt.id,
            adapter=ckpt if ckpt.format != "full" else None,
            lineage=bool(job.spec.get("lineage")),
            full=ckpt.format == "full",
        )
    if model.startswith("tinker://"):  # a Tinker run's sampler weights (docs/tinker.md)
        sampler = find_sampler(session, tenant_id, model)
        if sampler is None:
            raise model_not_found(model)
        # serve resolves the id itself (an adapter on its run's base); an openai backend loads
        # the adapter under that id, as a job's adapter checkpoint
        return Target(sampler.id, adapter=sampler)
    if find_model(session, model) is None:
        raise model_not_found(model)
    return Target(model)


def unavailable(detail: str) -> ProblemError:
    return ProblemError(503, "Service Unavailable", detail, headers={"Retry-After": "5"})


def backend_url(settings: Settings) -> str:
    if not settings.inference_url:
        raise unavailable("no inference backend is configured (GRPO_INFERENCE_URL)")
    return settings.inference_url.rstrip("/")


def headers(settings: Settings) -> dict[str, str]:
    token = settings.inference_token
    return {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}


def backend_problem(status: int, body: bytes) -> ProblemError:
    """The backend's error as a problem: its 4xx say what was wrong with the request; anything
    else is the backend's failure (502)."""
    message = _message(body)
    if 400 <= status < 500 and status not in (401, 403):
        title = {404: "Not Found", 429: "Too Many Requests"}.get(status, "Bad Request")
        return ProblemError(status if status in (404, 429) else 400, title, message)
    return ProblemError(502, "Bad Gateway", f"inference backend answered {status}: {message}")


def _message(body: bytes) -> str:
    import json

    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500] or "no detail"
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    for key in ("message", "detail"):  # vLLM's older `{object: "error", message}`; FastAPI's
        if isinstance(data, dict) and data.get(key):
            return str(data[key])
    return str(data)[:500]


# Adapters this API process has had the openai backend load (it keeps them until restarted;
# a second load of the same name is answered 400 "already loaded", also fine). A backend that
# restarted answers 404 for one: `forget_adapter`, and it is loaded again.
_loaded_adapters: set[str] = set()


def forget_adapter(target: Target) -> bool:
    """Whether `target` is an adapter this process had loaded (now to be loaded again)."""
    if target.adapter is None or target.adapter.id not in _loaded_adapters:
        return False
    _loaded_adapters.discard(target.adapter.id)
    return True


def prepare_openai_adapter(
    target: Target, settings: Settings, storage: ObjectStorage, client: httpx.Client
) -> None:
    """Unpack an adapter checkpoint where the backend reads it and load it there by its id."""
    if target.full or target.lineage:
        raise ProblemError(
            400,
            "Bad Request",
            f"{target.model}: this service's inference backend serves catalog models and "
            "adapter checkpoints trained on them, not full or stacked checkpoints",
        )
    ckpt = target.adapter
    if ckpt is None or ckpt.id in _loaded_adapters:
        return
    if settings.inference_lora_dir is None:
        raise ProblemError(400, "Bad Request", "this service's inference backend takes no adapters")
    path = _unpack(ckpt, settings.inference_lora_dir, storage)
    if settings.inference_lora_backend_dir:  # the same folder, where the backend mounts it
        path = Path(settings.inference_lora_backend_dir) / path.name
    r = client.post(
        f"{backend_url(settings)}/v1/load_lora_adapter",
        json={"lora_name": ckpt.id, "lora_path": str(path)},
        headers=headers(settings),
    )
    if r.status_code >= 400 and "already" not in r.text.lower():
        raise backend_problem(r.status_code, r.content)
    _loaded_adapters.add(ckpt.id)


def _unpack(ckpt: Checkpoint | TinkerCheckpoint, root: Path, storage: ObjectStorage) -> Path:
    target = root.expanduser().resolve() / ckpt.id
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpack-"))
    try:
        storage.download_file(ckpt.object_key, work / "ckpt.tar")
        extract_tar(work / "ckpt.tar", work / "dir")
        try:
            (work / "dir").rename(target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def forward_body(body: Any) -> dict[str, Any]:
    """The validated body as the backend gets it: only what the caller set."""
    return body.model_dump(exclude_unset=True, exclude_none=True)
