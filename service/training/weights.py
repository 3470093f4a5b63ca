"""Where a claimed job's starting weights lie on this worker: its catalog model (a local
directory, or the Hub snapshot pinned at submission, from the shared HF_HOME cache), or the
tenant's checkpoints (or Tinker sampler weights) it fine-tunes from, fetched from storage and
unpacked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.catalog.lineage import LineageRow, is_full, lineage_rows
from service.core.db import session_scope
from service.models import CatalogModel, Job
from service.settings import Settings
from service.storage import ObjectStorage
from service.storage.archive import extract_tar

if TYPE_CHECKING:
    from workers.grpo.policy import BaseWeights


def base_weights(
    job: Job, storage: ObjectStorage, settings: Settings, work_dir: Path
) -> BaseWeights:
    return weights_for(job.base_model, job.spec, storage, settings, work_dir)


def weights_for(
    catalog_model: str | None,
    spec: dict[str, Any],
    storage: ObjectStorage,
    settings: Settings,
    work_dir: Path,
) -> BaseWeights:
    """The weights of a stored spec (a job's, a pre-flight's) on `catalog_model`."""
    from workers.grpo.policy import BaseWeights, ModelLoadError  # torch: worker processes only

    name = spec["base_model"]
    if catalog_model is None:  # only jobs queued before the catalog existed have none
        raise ModelLoadError(f"base_model {name!r} is not in the model catalog")
    with session_scope() as session:
        model = session.get(CatalogModel, catalog_model)
        chain = lineage_rows(session, spec.get("lineage", []))
        if model is not None:
            session.expunge(model)
        for c in chain:
            if c is not None:
                session.expunge(c)
    if model is None:
        raise ModelLoadError(f"{catalog_model!r} was removed from the model catalog")
    if any(c is None for c in chain):
        raise ModelLoadError(f"a checkpoint under base_model {name!r} was deleted")
    dirs = [_unpack(c, storage, work_dir / "base") for c in chain if c is not None]
    # The chain runs from the parent down to full weights (a full checkpoint, or the catalog
    # model): adapters above those are merged in, oldest first.
    if chain and is_full(chain[-1]):
        root, adapters = str(dirs[-1]), dirs[-2::-1]
    else:
        root, adapters = model_path(model, settings), dirs[::-1]
    return BaseWeights(path=root, adapters=tuple(adapters), name=name)


def model_path(model: CatalogModel, settings: Settings) -> str:
    from workers.grpo.policy import ModelLoadError

    if not model.is_hub:
        return model.source
    from huggingface_hub import snapshot_download

    from service.catalog.inspect import HUB_FILES

    token = settings.hf_token.get_secret_value() if settings.hf_token else None
    try:  # the revision pinned at `models add`: the cache has it unless HF_HOME is not shared
        return snapshot_download(
            model.source,
            revision=model.revision,
            token=token,
            allow_patterns=HUB_FILES,
            local_files_only=settings.hf_offline,
        )
    except Exception as exc:  # noqa: BLE001 - the hub's own reason
        raise ModelLoadError(f"cannot fetch {model.name!r} ({model.source}): {exc}") from exc


def _unpack(checkpoint: LineageRow, storage: ObjectStorage, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    archive, directory = into / f"{checkpoint.id}.tar", into / checkpoint.id
    storage.download_file(checkpoint.object_key, archive)
    extract_tar(archive, directory)
    archive.unlink()
    return directory
