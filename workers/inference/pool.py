"""Loaded models, least recently used first out: bases (full weights, with any merged adapters)
keyed by where their weights lie, and on each base its peft adapters, loaded once by name
(`load_adapter`) and switched per batch (`set_adapter`), so serving another adapter of the same
base never reloads the base. The base alone runs with the adapters disabled.

Used from one thread only (the engine's): no locks.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from workers.inference.params import ModelRef
from workers.models import lora
from workers.models.loading import ModelLoadError, load_pretrained

__all__ = ["LoadedBase", "ModelLoadError", "ModelPool", "PoolStats"]


@dataclass
class LoadedBase:
    model: Any  # a transformers model, or a PeftModel once an adapter is loaded on it
    tokenizer: Any
    adapters: OrderedDict[str, None] = field(default_factory=OrderedDict)  # LRU of names


@dataclass
class PoolStats:
    base_loads: int = 0
    adapter_loads: int = 0
    base_evictions: int = 0
    adapter_evictions: int = 0


class ModelPool:
    def __init__(self, max_models: int, max_adapters: int, device: str | None = None) -> None:
        # transformers' and peft's lazy modules are not safe to initialise from two threads at
        # once: the engine's first load racing a request thread that imports them through
        # another module failed with "cannot import name 'AutoModelForCausalLM'". Imported
        # here, in the thread that builds the pool, before any other starts.
        import peft  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

        self.max_models, self.max_adapters = max_models, max_adapters
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.bases: OrderedDict[tuple[str, tuple[str, ...]], LoadedBase] = OrderedDict()
        self.stats = PoolStats()

    @contextlib.contextmanager
    def use(self, ref: ModelRef) -> Iterator[tuple[Any, Any]]:
        """The model (with `ref`'s adapter active, or none) and its tokenizer."""
        base = self._base(ref)
        if ref.adapter is None:
            disabled = base.model.disable_adapter() if base.adapters else contextlib.nullcontext()
            with disabled:
                yield base.model, base.tokenizer
            return
        name = self._adapter(base, ref)
        base.model.set_adapter(name)
        yield base.model, base.tokenizer

    def describe(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "loaded": [
                {"weights": w, "merged": list(m), "adapters": list(b.adapters)}
                for (w, m), b in self.bases.items()
            ],
            **vars(self.stats),
        }

    def _base(self, ref: ModelRef) -> LoadedBase:
        key = ref.base_key
        if key in self.bases:
            self.bases.move_to_end(key)
            return self.bases[key]
        while len(self.bases) >= self.max_models:
            self.bases.popitem(last=False)
            self.stats.base_evictions += 1
            if self.device == "cuda":
                torch.cuda.empty_cache()
        self.bases[key] = self._load(ref)
        self.stats.base_loads += 1
        return self.bases[key]

    def _load(self, ref: ModelRef) -> LoadedBase:
        # frozen: bf16 on a GPU, fp32 on CPU (no fast half-precision kernels there), with the
        # lineage under the served weights merged in, oldest first; on CPU x @ W.T as a plain
        # product (column-major weights): faster few-row decoding
        loaded = load_pretrained(ref.weights, self.device, frozen=True, merge=ref.merged,
                                 column_major=True, label=f"model {ref.label!r}")  # fmt: skip
        return LoadedBase(loaded.model, loaded.tokenizer)

    def _adapter(self, base: LoadedBase, ref: ModelRef) -> str:
        assert ref.adapter is not None
        # peft keys modules by adapter name: no dots or slashes, so a digest of the path
        name = "a" + hashlib.sha256(ref.adapter.encode()).hexdigest()[:16]
        if name in base.adapters:
            base.adapters.move_to_end(name)
            return name
        if len(base.adapters) >= self.max_adapters:
            old, _ = base.adapters.popitem(last=False)
            base.model.delete_adapter(old)
            self.stats.adapter_evictions += 1
        try:
            base.model = lora.load_adapter(base.model, ref.adapter, name=name)
        except Exception as exc:  # noqa: BLE001 - a broken or mismatched adapter
            raise ModelLoadError(f"cannot load adapter {ref.label!r}: {exc}") from exc
        base.model.eval()
        base.adapters[name] = None
        self.stats.adapter_loads += 1
        return name
