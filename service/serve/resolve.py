"""A model id the API has authorised (a catalog name or a checkpoint id) to weights on this
machine, from the database alone: the request never names a path. Checkpoints are fetched from
storage once and unpacked into the serve cache (they never change once committed)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from sqlalchemy.orm import Session

from service.catalog.lineage import is_full, lineage_rows
from service.core.db import session_scope
from service.models import CatalogModel, Checkpoint, Job, TinkerCheckpoint, TinkerRun
from service.settings import Settings
from service.storage import ObjectStorage
from service.storage.archive import extract_tar
from service.training.weights import model_path
from workers.inference.params import ModelRef


class UnknownModel(LookupError):
    """No such catalog model or checkpoint (or its weights are gone)."""


class Resolver:
    def __init__(self, settings: Settings, storage: ObjectStorage) -> None:
        self.settings, self.storage = settings, storage
        self.cache = settings.data_path / "serve-cache"

    def resolve(self, model: str) -> ModelRef:
        with session_scope() as session:
            if model.startswith("ckpt_"):
                return self._checkpoint(session, model)
            if model.startswith("tkc_"):  # a Tinker sampler checkpoint (docs/tinker.md)
                return self._tinker(session, model)
            row = session.get(CatalogModel, model)
            if row is None:
                raise UnknownModel(f"model '{model}' not found")
            return ModelRef(weights=model_path(row, self.settings), label=model)

    def _checkpoint(self, session: Session, checkpoint_id: str) -> ModelRef:
        ckpt = session.get(Checkpoint, checkpoint_id)
        job = session.get(Job, ckpt.job_id) if ckpt is not None else None
        if ckpt is None or job is None:
            raise UnknownModel(f"model '{checkpoint_id}' not found")
        if ckpt.format == "full":
            return ModelRef(weights=self._unpacked(ckpt), label=checkpoint_id)
        # An adapter on its job's starting weights: the lineage, nearest first, down to full
        # weights (a full checkpoint, or the catalog model); adapters above those are merged.
        chain = lineage_rows(session, job.spec.get("lineage", []))
        if any(c is None for c in chain):
            raise UnknownModel(f"a checkpoint under '{checkpoint_id}' was deleted")
        dirs = [self._unpacked(c) for c in chain if c is not None]
        if chain and is_full(chain[-1]):
            root, merged = dirs[-1], tuple(dirs[-2::-1])
        else:
            catalog = session.get(CatalogModel, job.base_model or "")
            if catalog is None:
                raise UnknownModel(f"the base of '{checkpoint_id}' left the catalog")
            root, merged = model_path(catalog, self.settings), tuple(dirs[::-1])
        return ModelRef(root, merged, self._unpacked(ckpt), label=checkpoint_id)

    def _tinker(self, session: Session, checkpoint_id: str) -> ModelRef:
        ckpt = session.get(TinkerCheckpoint, checkpoint_id)
        run = session.get(TinkerRun, ckpt.run_id) if ckpt is not None else None
        catalog = session.get(CatalogModel, run.base_model) if run is not None else None
        if ckpt is None or ckpt.kind != "sampler" or catalog is None:
            raise UnknownModel(f"model '{checkpoint_id}' not found")
        root = model_path(catalog, self.settings)
        return ModelRef(root, (), self._unpacked(ckpt), label=checkpoint_id)

    def _unpacked(self, ckpt: Checkpoint | TinkerCheckpoint) -> str:
        target = self.cache / ckpt.id
        if not target.is_dir():
            self.cache.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(dir=self.cache, prefix=".unpack-"))
            try:
                self.storage.download_file(ckpt.object_key, work / "ckpt.tar")
                extract_tar(work / "ckpt.tar", work / "dir")
                (work / "dir").rename(target)  # whole or not at all
            except FileExistsError:  # unpacked meanwhile by a concurrent request
                pass
            except OSError:
                if not target.is_dir():
                    raise
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return str(target)
