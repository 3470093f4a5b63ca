"""Object storage: a small interface over a local directory or an S3-compatible bucket.

Checkpoints, adapters, datasets and logs are stored as opaque objects addressed by a
slash-separated *key* (``jobs/42/adapter.safetensors``). Two backends implement the same
:class:`ObjectStorage` protocol:

* :class:`LocalStorage` -- files under a root directory (``file:///abs/path`` or a plain path).
* :class:`S3Storage` -- objects in an S3 bucket, optionally under a prefix
  (``s3://bucket/prefix``), via boto3; works with AWS, MinIO, moto and friends.

Writes are atomic on both backends: a reader sees either the previous object, nothing, or the
complete new object -- never a partial one. Missing objects raise :class:`ObjectNotFound`.

Use :func:`open_storage` to build a backend from a URL. This module must stay importable by
the API and by the workers, so it depends on neither FastAPI nor torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from .base import DEFAULT_CHUNK_SIZE, InvalidKey, ObjectNotFound, ObjectStorage, validate_key
from .local import LocalStorage
from .s3 import S3Storage, make_s3_client

if TYPE_CHECKING:
    from service.settings import Settings

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "InvalidKey",
    "LocalStorage",
    "ObjectNotFound",
    "ObjectStorage",
    "S3Storage",
    "make_s3_client",
    "open_storage",
    "open_storage_from_settings",
    "validate_key",
]


def open_storage(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> ObjectStorage:
    """Build a store from ``file:///abs/path``, a plain path, or ``s3://bucket[/prefix]``."""
    if not url:
        raise ValueError("storage URL must not be empty")
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "s3":
        bucket = parsed.netloc
        if not bucket:
            raise ValueError(f"storage URL {url!r} has no bucket")
        client = make_s3_client(
            endpoint_url=endpoint_url,
            region=region,
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
        )
        return S3Storage(client, bucket, unquote(parsed.path).strip("/"), region=region)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"storage URL {url!r}: file URLs must not name a remote host")
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise ValueError(f"storage URL {url!r}: file URLs need an absolute path")
        return LocalStorage(path)
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):  # plain path (or C:\...)
        return LocalStorage(url)
    raise ValueError(f"unsupported storage URL scheme {parsed.scheme!r} in {url!r}")


def open_storage_from_settings(settings: Settings) -> ObjectStorage:
    """The storage a process is configured for (`GRPO_STORAGE_URL` and the `GRPO_S3_*` keys)."""
    storage = open_storage(
        settings.effective_storage_url,
        endpoint_url=settings.s3_endpoint_url,
        region=settings.s3_region,
        access_key_id=settings.s3_access_key_id,
        secret_access_key=settings.s3_secret_access_key,
    )
    if settings.s3_create_bucket and isinstance(storage, S3Storage):
        storage.ensure_bucket()
    return storage
