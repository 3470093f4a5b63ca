"""Checkpoint archives: one uncompressed tar whose root loads with `from_pretrained`."""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
from pathlib import Path


def make_tar(directory: Path) -> tuple[Path, str, int]:
    """Tar the directory's contents (no leading folder); returns (path, sha256, size)."""
    fd, name = tempfile.mkstemp(suffix=".tar", dir=directory.parent)
    path = Path(name)
    with open(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w") as tar:
        for item in sorted(directory.rglob("*")):
            tar.add(item, arcname=str(item.relative_to(directory)), recursive=False)
    digest = hashlib.sha256()
    with path.open("rb") as stored:
        for chunk in iter(lambda: stored.read(1 << 20), b""):
            digest.update(chunk)
    return path, digest.hexdigest(), path.stat().st_size


def extract_tar(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
