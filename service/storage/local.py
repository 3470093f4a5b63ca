"""Local-directory backend: objects are files under a root directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .base import (
    DEFAULT_CHUNK_SIZE,
    TMP_PREFIX,
    InvalidKey,
    ObjectNotFound,
    check_chunk_size,
    validate_key,
)

_COPY_BUFSIZE = 1 << 20


def _fsync_dir(directory: Path) -> None:
    """Persist a rename in ``directory``; best effort (not all platforms allow it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(dest: Path, fill: Callable[[IO[bytes]], Any]) -> None:
    """Create ``dest`` atomically: ``fill(fileobj)`` writes a temp file that then replaces it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(dest.parent)


def _iter_file(fh: IO[bytes], chunk_size: int) -> Iterator[bytes]:
    try:
        while chunk := fh.read(chunk_size):
            yield chunk
    finally:
        fh.close()


def _iter_file_range(fh: IO[bytes], remaining: int, chunk_size: int) -> Iterator[bytes]:
    try:
        while remaining > 0:
            chunk = fh.read(min(chunk_size, remaining))
            if not chunk:
                return
            remaining -= len(chunk)
            yield chunk
    finally:
        fh.close()


class LocalStorage:
    """Objects as files under ``root``; ``a/b/c`` lives at ``root/a/b/c``."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def path_for(self, key: str) -> Path:
        """Filesystem path of ``key``; raise :class:`InvalidKey` if it would leave root."""
        validate_key(key)
        path = self.root.joinpath(*key.split("/"))
        # Defence in depth against symlinks inside root pointing elsewhere.
        if not path.resolve().is_relative_to(self.root):
            raise InvalidKey(f"invalid object key {key!r}: escapes the storage root")
        return path

    def put_file(self, key: str, path: Path) -> None:
        dest = self.path_for(key)
        with open(path, "rb") as src:
            _atomic_write(dest, lambda dst: shutil.copyfileobj(src, dst, _COPY_BUFSIZE))

    def put_bytes(self, key: str, data: bytes) -> None:
        dest = self.path_for(key)
        _atomic_write(dest, lambda dst: dst.write(data))

    def _open(self, key: str) -> IO[bytes]:
        path = self.path_for(key)
        try:
            return open(path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key) from None

    def get_bytes(self, key: str) -> bytes:
        with self._open(key) as fh:
            return fh.read()

    def open_stream(self, key: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        check_chunk_size(chunk_size)
        return _iter_file(self._open(key), chunk_size)

    def open_range(
        self, key: str, start: int, end: int, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[bytes]:
        """Yield bytes ``start..end`` (inclusive) of the object, in chunks."""
        check_chunk_size(chunk_size)
        fh = self._open(key)
        fh.seek(start)
        return _iter_file_range(fh, end - start + 1, chunk_size)

    def download_file(self, key: str, path: Path) -> None:
        with self._open(key) as src:
            _atomic_write(Path(path), lambda dst: shutil.copyfileobj(src, dst, _COPY_BUFSIZE))

    def size(self, key: str) -> int:
        path = self.path_for(key)
        if not path.is_file():
            raise ObjectNotFound(key)
        return path.stat().st_size

    def exists(self, key: str) -> bool:
        return self.path_for(key).is_file()

    def delete(self, key: str) -> None:
        path = self.path_for(key)
        # Empty parent directories are left in place: removing them would race with a
        # concurrent writer that has just created them.
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            path.unlink()

    def presigned_url(self, key: str, expires_s: int = 300) -> str | None:
        validate_key(key)
        return None

    def ping(self) -> None:
        if not self.root.is_dir():
            raise OSError(f"storage root {self.root} is not a directory")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise PermissionError(f"storage root {self.root} is not writable")
