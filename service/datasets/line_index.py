"""Where a stored dataset's lines start, every EVERY-th line: a page of records is read from
the nearest such line to the page's end, never the whole file.

Kept beside the dataset's canonical JSONL as `<object key>.lines`: the little-endian uint64
byte offsets of lines 0, EVERY, 2 * EVERY, ..., written with the dataset. A page reads two of
them (a ranged read) whatever the dataset's size. A dataset stored before the index existed
gets one at its first page read: one streaming pass over the file, stored for every later read.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Generator, Iterable, Iterator, Sequence

from service.storage import ObjectNotFound, ObjectStorage

EVERY = 64  # lines a page may read and skip before its first: at most EVERY - 1
CHUNK = 64 << 10  # bytes read at once: with one line and the page, all a read holds
_ENTRY = struct.Struct("<Q")


def key_for(object_key: str) -> str:
    return f"{object_key}.lines"


def encode(starts: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(starts)}Q", *starts)


class _ChunkStream(io.RawIOBase):
    """An iterator of byte chunks as a raw stream, for `io.BufferedReader`'s readline."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()  # the file or the S3 body under it
        super().close()


def iter_lines(chunks: Iterator[bytes]) -> Generator[bytes, None, None]:
    """The lines of a stream, each with its newline; holds a buffer and one line at most."""
    with io.BufferedReader(_ChunkStream(chunks), buffer_size=CHUNK) as reader:
        yield from reader


def scan(lines: Iterable[bytes]) -> list[int]:
    """The offsets of every EVERY-th line."""
    starts, offset = [], 0
    for number, line in enumerate(lines):
        if number % EVERY == 0:
            starts.append(offset)
        offset += len(line)
    return starts


def _entries(storage: ObjectStorage, object_key: str, first: int, last: int) -> list[int]:
    raw = b"".join(
        storage.open_range(key_for(object_key), first * _ENTRY.size, (last + 1) * _ENTRY.size - 1)
    )
    return [value for (value,) in _ENTRY.iter_unpack(raw[: len(raw) // _ENTRY.size * _ENTRY.size])]


def span(storage: ObjectStorage, object_key: str, first: int, last: int) -> tuple[int, int | None]:
    """Where line `first * EVERY` starts and where line `last * EVERY` does (None: past the
    last line, the file's end). Builds the dataset's index if it has none."""
    try:
        found = _entries(storage, object_key, first, last)
    except ObjectNotFound:  # stored before the index existed
        starts = scan(iter_lines(storage.open_stream(object_key, CHUNK)))
        storage.put_bytes(key_for(object_key), encode(starts))
        found = starts[first : last + 1]
    return found[0], found[last - first] if len(found) > last - first else None
