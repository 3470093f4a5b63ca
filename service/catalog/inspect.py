"""What the catalog records of a model, read by the operator's CLI (never by the API process):
the config, an empty (meta-device) instance for the parameter count and the modules LoRA can
wrap, the tokenizer for its chat template, and the files for their size and content hash.
Hub ids are fetched once into the shared Hugging Face cache (`HF_HOME`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from service.catalog.facts import ModelFacts

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}(/[\w.\-]{1,96})?$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
# What a causal LM needs from a Hub repository; other files (other formats, images) are skipped.
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


class ModelSourceError(ValueError):
    """The source is not a model the catalog can hold; the message says why."""


def is_local_source(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or Path(source).expanduser().exists()


def fetch_hub(repo_id: str, revision: str | None, token: str | None, offline: bool) -> Path:
    """The snapshot of `repo_id` in the shared cache, downloaded unless it is there already
    (or offline mode forbids it: then only the cache is used)."""
    from huggingface_hub import snapshot_download

    if not HUB_ID.match(repo_id):
        raise ModelSourceError(f"{repo_id!r} is neither a local directory nor a Hub model id")
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            token=token,
            allow_patterns=HUB_FILES,
            local_files_only=offline,
        )
    except Exception as exc:  # noqa: BLE001 - the hub's own error says why (gated, missing, offline)
        raise ModelSourceError(f"cannot fetch {repo_id!r} from the Hub: {exc}") from exc
    return Path(path)


def inspect_model(path: Path, source_kind: str) -> ModelFacts:
    """Facts of the model saved in `path` (a `save_pretrained` directory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        with torch.device("meta"):  # shapes only: no weight is read or allocated
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - transformers says what is missing or unknown
        raise ModelSourceError(f"not a causal language model with a tokenizer: {exc}") from exc
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    revision = path.name if source_kind == "hub" and COMMIT_SHA.match(path.name) else None
    return ModelFacts(
        source_kind=source_kind,
        path=path,
        revision=revision or content_sha256(path),
        architecture=type(model).__name__,
        model_type=str(config.model_type),
        num_parameters=sum(p.numel() for p in model.parameters()),
        context_length=_context_length(text_config, tokenizer),
        dtype=_dtype_name(config),
        size_bytes=sum(f.stat().st_size for f in _files(path)),
        hidden_size=int(getattr(text_config, "hidden_size", 0) or 0),
        num_layers=int(getattr(text_config, "num_hidden_layers", 0) or 0),
        vocab_size=int(getattr(text_config, "vocab_size", 0) or 0),
        intermediate_size=int(getattr(text_config, "intermediate_size", 0) or 0),
        kv_dim=_kv_dim(text_config),
        lora_targets=lora_targets(model),
        chat_template=_chat_template(tokenizer),
        tokenizer_json=_tokenizer_json(tokenizer),
        special_tokens={
            k: str(getattr(tokenizer, k))
            for k in ("bos_token", "eos_token", "pad_token")
            if getattr(tokenizer, k, None) is not None
        },
    )


def lora_targets(model: Any) -> dict[str, dict[str, Any]]:
    """The modules peft can wrap with LoRA, by full name: `{in, out, kind}` with kind
    `linear` (GPT-2's Conv1D too), `output` (the LM head, which 'all-linear' leaves out) or
    `embedding`. The sizes feed the memory plan."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    shapes: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            kind = "output" if module is head else "linear"
            shapes[name] = {"in": module.in_features, "out": module.out_features, "kind": kind}
        elif isinstance(module, Conv1D):  # its weight is stored transposed: (in, out)
            shapes[name] = {"in": int(module.weight.shape[0]), "out": module.nf, "kind": "linear"}
        elif isinstance(module, nn.Embedding):
            shapes[name] = {
                "in": module.num_embeddings, "out": module.embedding_dim, "kind": "embedding"
            }  # fmt: skip
    return shapes


def _kv_dim(config: Any) -> int:
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or (hidden // heads if heads else 0))
    return kv_heads * head_dim


def content_sha256(path: Path) -> str:
    """One digest of every file's relative name and bytes: a local model's revision."""
    digest = hashlib.sha256()
    for file in _files(path):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _files(path: Path) -> list[Path]:
    return sorted(f for f in path.rglob("*") if f.is_file() and ".cache" not in f.parts)


def _context_length(config: Any, tokenizer: Any) -> int:
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**7:
        return limit
    raise ModelSourceError("the config names no context length (max_position_embeddings)")


def _dtype_name(config: Any) -> str:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


def _chat_template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one renders chat prompts
        template = template.get("default")
    return template or None


def _tokenizer_json(tokenizer: Any) -> str | None:
    """The fast tokenizer serialised, so the API can count prompt tokens with `tokenizers`
    alone (no torch, no transformers in the API process)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend.to_str() if backend is not None else None
