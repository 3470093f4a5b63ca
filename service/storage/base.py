"""Shared definitions for the object-storage backends: the protocol, errors and key rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

DEFAULT_CHUNK_SIZE = 1 << 20
TMP_PREFIX = ".tmp-"


class ObjectNotFound(KeyError):
    """The requested key does not exist in the store."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"object not found: {self.key!r}"


class InvalidKey(ValueError):
    """The key is empty, absolute, or would escape the store (``..``)."""


@runtime_checkable
class ObjectStorage(Protocol):
    """What the API and the workers need from an object store."""

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file atomically: readers never see a partial object."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """Return the whole object; raise :class:`ObjectNotFound` if missing."""
        ...

    def open_stream(self, key: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        """Yield the object in chunks of at most ``chunk_size`` bytes.

        Raises :class:`ObjectNotFound` immediately (not on first iteration) if missing.
        """
        ...

    def open_range(
        self, key: str, start: int, end: int, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[bytes]:
        """Yield bytes ``start..end`` (inclusive, like HTTP Range) of the object, in chunks."""
        ...

    def download_file(self, key: str, path: Path) -> None:
        """Write the object to ``path`` (atomically replacing it); create parent dirs."""
        ...

    def size(self, key: str) -> int:
        """Size of the object in bytes; raise :class:`ObjectNotFound` if missing."""
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""
        ...

    def presigned_url(self, key: str, expires_s: int = 300) -> str | None:
        """A time-limited GET URL, or ``None`` where the backend has none (local)."""
        ...

    def ping(self) -> None:
        """Raise if the store is unreachable or unusable (used by ``/readyz``)."""
        ...


def validate_key(key: str) -> str:
    """Check that ``key`` is a relative, normalised, slash-separated path; return it.

    Both backends enforce the same rules so that a key valid for one is valid for the other.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"invalid object key {key!r}: must be a non-empty string")
    if "\x00" in key or "\\" in key:
        raise InvalidKey(f"invalid object key {key!r}: NUL and backslash are not allowed")
    if key.startswith("/"):
        raise InvalidKey(f"invalid object key {key!r}: must not be absolute")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidKey(f"invalid object key {key!r}: empty, '.' or '..' segment")
    return key


def check_chunk_size(chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
