"""The Parquet form of rollout rows: one file per (job, split, step), one schema for all.

`scores` (verifier -> score, null where it gave none) and `errors` (verifier -> message) are
Parquet maps; `messages` (a chat-shaped record's prompt) is its JSON text, since a message may
carry keys of its own (name, tool calls). The worker writes these files; the API reads them
back (`decode_rows`) and concatenates them for a download (`stream_concatenated`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([
    ("step", pa.int32()),
    ("split", pa.string()),
    ("group", pa.int32()),
    ("index", pa.int32()),
    ("record", pa.int32()),
    ("prompt", pa.string()),
    ("messages", pa.string()),  # JSON, null when the prompt was plain text
    ("completion", pa.string()),
    ("reward", pa.float64()),
    ("scores", pa.map_(pa.string(), pa.float64())),
    ("advantage", pa.float64()),  # null for eval rows
    ("length", pa.int32()),
    ("truncated", pa.bool_()),
    ("finish_reason", pa.string()),
    ("errors", pa.map_(pa.string(), pa.string())),
])  # fmt: skip
PARQUET_MEDIA_TYPE = "application/vnd.apache.parquet"


def encode_rows(rows: list[dict[str, Any]]) -> bytes:
    """The rows as one Parquet file (zstd: completions repeat themselves a lot)."""
    table = pa.Table.from_pylist(
        [r | {"messages": None if r["messages"] is None else json.dumps(r["messages"])}
         for r in rows],
        schema=SCHEMA,
    )  # fmt: skip
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def read_table(data: bytes) -> pa.Table:
    """A stored file's table, in the current schema (columns in its order)."""
    return pq.read_table(io.BytesIO(data)).select(SCHEMA.names).cast(SCHEMA)


def decode_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as the hook produced them: maps back to dicts, messages back to lists."""
    rows = table.to_pylist()
    for r in rows:
        r["scores"], r["errors"] = dict(r["scores"]), dict(r["errors"])
        r["messages"] = None if r["messages"] is None else json.loads(r["messages"])
    return rows


class _Chunks:
    """A write-only file for ParquetWriter that hands out what was written since last asked."""

    closed = False

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._written = 0

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


def stream_concatenated(keys: Iterable[str], get_bytes: Callable[[str], bytes]) -> Iterator[bytes]:
    """One Parquet file made of the stored ones, yielded as it is written: a row group per
    stored file, so at most one step's rows are in memory at a time."""
    sink = _Chunks()
    writer = pq.ParquetWriter(sink, SCHEMA, compression="zstd")
    try:
        for key in keys:
            writer.write_table(read_table(get_bytes(key)))
            chunk = sink.take()
            if chunk:
                yield chunk
    finally:
        writer.close()
    yield sink.take()
