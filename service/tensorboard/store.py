"""A job's TensorBoard event files in object storage: one tar per attempt (epoch), replaced at
each checkpoint and at the end; downloaded as one streamed tar.gz holding every attempt's files
in one folder (TensorBoard reads it as one run; a resumed attempt's `purge_step` drops the
events of the steps it redid)."""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from service.storage import ObjectStorage


def tensorboard_key(tenant_id: str, job_id: str, epoch: int) -> str:
    return f"tenants/{tenant_id}/jobs/{job_id}/e{epoch}/tensorboard.tar"


def upload_tensorboard(storage: ObjectStorage, key: str, directory: Path) -> None:
    """Tar the event files (flat) and store them under `key`, replacing the previous upload."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    if not files:
        return
    with tempfile.NamedTemporaryFile(suffix=".tar", dir=directory.parent) as tmp:
        with tarfile.open(fileobj=tmp, mode="w") as tar:
            for path in files:
                tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
        tmp.flush()
        storage.put_file(key, Path(tmp.name))


def tensorboard_keys(storage: ObjectStorage, tenant_id: str, job_id: str, epochs: int) -> list[str]:
    """The stored tars of the job's attempts, oldest first."""
    keys = (tensorboard_key(tenant_id, job_id, e) for e in range(1, epochs + 1))
    return [key for key in keys if storage.exists(key)]


class _Chunks:
    """A write-only file whose bytes are handed out as they come (the streamed gzip)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def tensorboard_stream(storage: ObjectStorage, folder: str, keys: list[str]) -> Iterator[bytes]:
    """One tar.gz of every attempt's event files under `folder/`, produced a file at a time."""
    out = _Chunks()
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=out, mode="w|gz") as archive:  # type: ignore[call-overload]
            for i, key in enumerate(keys):
                local = Path(tmp) / f"{i}.tar"
                storage.download_file(key, local)
                with tarfile.open(local) as attempt:
                    for member in attempt:
                        source = attempt.extractfile(member) if member.isfile() else None
                        if source is None:
                            continue
                        member.name = f"{folder}/{Path(member.name).name}"
                        archive.addfile(member, source)
                        yield out.take()
                local.unlink()
        yield out.take()
