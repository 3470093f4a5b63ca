"""Read what the trackers wrote back from their own stores (no tracker code of ours)."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

BLOCK = 32768  # W&B's transaction log: LevelDB's log format, 32 KiB blocks
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """Every record of a `.wandb` file (its header ":W&B", then LevelDB-log records) as
    wandb's own protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", ident
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):
            break  # a record still being written
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending + chunk if kind == LAST else chunk)
            out.append(record)
    return out


def wandb_history(path: Path, timeout_s: float = 60.0) -> list[dict[str, str]]:
    """The run's history rows: {key: value as JSON}, once the run's exit record is written
    (W&B's service process writes the file on its own time, after `finish` returns)."""
    deadline = time.monotonic() + timeout_s
    records = wandb_records(path)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
        time.sleep(0.2)
        records = wandb_records(path)
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
            )
    return rows


def scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a TensorBoard scalar, as TensorBoard reads the folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def tensorboard_texts(logdir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return [e.step for e in acc.Tensors(tag)]
