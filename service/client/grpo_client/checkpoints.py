"""Checkpoints: list them, delete one, and download one streamed to disk, resumable,
sha256-checked.

A download writes `<dest>.part` first. If a `.part` is already there (an interrupted earlier
download) it asks for the rest with `Range: bytes=N-`; a 206 answer appends, a 200 (a server
without ranges) starts over. The finished file's sha256 must equal the listed one, else the
file is removed and ChecksumMismatch raised.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import httpx

from grpo_client.errors import ApiError, ChecksumMismatch, ConnectionFailed
from grpo_client.models import CheckpointOut
from grpo_client.transport import Transport

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)
CHUNK = 1 << 20


class Checkpoints:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(self, job_id: str) -> list[CheckpointOut]:
        data = self._t.json("GET", f"/v1/jobs/{job_id}/checkpoints")
        return [CheckpointOut.model_validate(c) for c in data["data"]]

    def get(self, job_id: str, step: int | str = "latest") -> CheckpointOut:
        """The listed checkpoint at `step` (a number or "latest"); 404 ApiError if none."""
        ckpts = self.list(job_id)
        if not ckpts:
            raise ApiError.local(404, "Not Found", f"job {job_id} has no checkpoints yet")
        if str(step) == "latest":
            return max(ckpts, key=lambda c: c.step)
        for ckpt in ckpts:
            if ckpt.step == int(step):
                return ckpt
        steps = ", ".join(str(c.step) for c in sorted(ckpts, key=lambda c: c.step))
        missing = f"job {job_id} has no checkpoint at step {step} ({steps})"
        raise ApiError.local(404, "Not Found", missing)

    def delete(self, job_id: str, step: int | str) -> None:
        """Delete the checkpoint at `step` (a number or "latest"): its row, then its archive.
        ApiError 404 if there is none, 409 while it is the latest of a live job (its resume
        point) or the base model of a live job."""
        self._t.request("DELETE", f"/v1/jobs/{job_id}/checkpoints/{step}")

    def download(
        self,
        job_id: str,
        step: int | str = "latest",
        dest: str | Path | None = None,
        *,
        progress: ProgressCallback | None = None,
        max_resumes: int = 5,
    ) -> Path:
        """Download the checkpoint tar to `dest` (a file, or a folder for the default name)
        and return its path."""
        ckpt = self.get(job_id, step)
        target = _target(dest, f"{job_id}-step-{ckpt.step}.tar")
        part = target.with_name(target.name + ".part")
        resumed = part.exists()
        self._fetch_with_resumes(job_id, ckpt, part, progress, max_resumes)
        digest = _sha256(part)
        if digest != ckpt.sha256 and resumed:  # a stale partial file: once more from zero
            part.unlink()
            self._fetch_with_resumes(job_id, ckpt, part, progress, max_resumes)
            digest = _sha256(part)
        if digest != ckpt.sha256:
            part.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"checkpoint {ckpt.id}: sha256 {digest} differs from the listed {ckpt.sha256}"
            )
        os.replace(part, target)
        return target

    def _fetch_with_resumes(
        self,
        job_id: str,
        ckpt: CheckpointOut,
        part: Path,
        progress: ProgressCallback | None,
        max_resumes: int,
    ) -> None:
        for attempt in range(max_resumes + 1):
            try:
                self._fetch(job_id, ckpt, part, progress)
                return
            except ConnectionFailed:
                if attempt == max_resumes:
                    raise

    def _fetch(
        self, job_id: str, ckpt: CheckpointOut, part: Path, progress: ProgressCallback | None
    ) -> None:
        have = part.stat().st_size if part.exists() else 0
        if have > ckpt.size_bytes:
            have = 0  # not ours to resume: start over
        elif have == ckpt.size_bytes and have:
            return  # already whole: the checksum decides
        headers = {"Range": f"bytes={have}-"} if have else {}
        path = f"/v1/jobs/{job_id}/checkpoints/{ckpt.step}/download"
        try:
            with self._t.stream("GET", path, headers=headers, timeout=60.0) as response:
                resumed = response.status_code == 206 and _starts_at(response, have)
                done = have if resumed else 0
                if progress:
                    progress(done, ckpt.size_bytes)
                with part.open("ab" if resumed else "wb") as fh:
                    for chunk in response.iter_bytes(CHUNK):
                        fh.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, ckpt.size_bytes)
        except ApiError as exc:
            if exc.status != 416:
                raise
            part.unlink(missing_ok=True)  # our partial file is not a prefix: start over
            raise ConnectionFailed("range not satisfiable; restarting") from exc


def _starts_at(response: httpx.Response, offset: int) -> bool:
    content_range = response.headers.get("Content-Range", "")
    return content_range.startswith(f"bytes {offset}-")


def _target(dest: str | Path | None, default_name: str) -> Path:
    """`dest` as a file path; an existing folder, or a string ending in "/", gets the default
    file name inside it."""
    if dest is None:
        return Path.cwd() / default_name
    as_dir = isinstance(dest, str) and dest.endswith(("/", os.sep))
    path = Path(dest)
    if as_dir or path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        return path / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()
