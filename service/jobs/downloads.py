"""Checkpoint downloads: streamed from storage in chunks (never whole in memory), single
HTTP byte ranges (206), or a 307 to a short-lived presigned URL where storage has them."""

from __future__ import annotations

import re

from fastapi.responses import RedirectResponse, Response, StreamingResponse

from service.core.problems import ProblemError
from service.http.content_disposition import attachment
from service.models import Checkpoint, Job
from service.settings import Settings
from service.storage import ObjectStorage

# ASCII digits, at most 18 (a longer number is no byte offset of ours: the header is ignored)
_RANGE = re.compile(r"^bytes=([0-9]{0,18})-([0-9]{0,18})$")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single `bytes=` range; None means the whole object (no
    header, or one this server ignores, as RFC 9110 allows). Unsatisfiable answers 416."""
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        return None  # multiple ranges or other units: send the whole object
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix: the last N bytes
        start, end = max(0, size - int(last)), size - 1
        if int(last) == 0:
            start = size
    else:
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
        if last and int(last) < start:
            return None  # syntactically invalid: ignored
    if start >= size or size == 0:
        raise ProblemError(
            416,
            "Range Not Satisfiable",
            f"the range {header!r} is outside the {size}-byte checkpoint",
            headers={"Content-Range": f"bytes */{size}"},
        )
    return start, end


def download_response(
    job: Job,
    ckpt: Checkpoint,
    storage: ObjectStorage,
    settings: Settings,
    range_header: str | None,
) -> Response:
    if settings.download_redirect:
        url = storage.presigned_url(ckpt.object_key, settings.download_url_expires_s)
        if url:
            return RedirectResponse(url, status_code=307, headers={"Cache-Control": "no-store"})
    size = ckpt.size_bytes
    headers = {
        "Accept-Ranges": "bytes",
        "Content-Disposition": attachment(f"{job.id}-step-{ckpt.step}.tar"),
        "X-Checkpoint-SHA256": ckpt.sha256,
        "X-Checkpoint-Step": str(ckpt.step),
    }
    byte_range = parse_range(range_header, size)
    if byte_range is None:
        headers["Content-Length"] = str(size)
        body = storage.open_stream(ckpt.object_key)
        return StreamingResponse(body, media_type="application/x-tar", headers=headers)
    start, end = byte_range
    headers["Content-Length"] = str(end - start + 1)
    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    body = storage.open_range(ckpt.object_key, start, end)
    return StreamingResponse(body, status_code=206, media_type="application/x-tar", headers=headers)
