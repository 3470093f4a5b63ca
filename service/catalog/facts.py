"""What the catalog records of a model (read by `service.catalog.inspect` in the operator's
CLI; kept apart so that the API, which stores them, never imports the code that reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ModelFacts:
    source_kind: str  # "local" | "hub"
    path: Path  # where it lies on this machine
    revision: str
    architecture: str
    model_type: str
    num_parameters: int
    context_length: int
    dtype: str
    size_bytes: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    intermediate_size: int
    kv_dim: int  # key/value width per layer: kv heads x head dim
    lora_targets: dict[str, dict[str, Any]]  # module name -> {in, out, kind}
    chat_template: str | None
    tokenizer_json: str | None
    special_tokens: dict[str, str] = field(default_factory=dict)
