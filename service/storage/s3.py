"""S3 backend (AWS, MinIO, moto, ...) via boto3; boto3 is imported lazily."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import DEFAULT_CHUNK_SIZE, TMP_PREFIX, ObjectNotFound, check_chunk_size, validate_key

if TYPE_CHECKING:  # pragma: no cover - typing only
    from botocore.exceptions import ClientError

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


def _is_not_found(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = str(error.get("Code", ""))
    if code == "NoSuchBucket":  # a configuration problem, not a missing object
        return False
    return code in _NOT_FOUND_CODES or status == 404


class S3Storage:
    """Objects in ``bucket`` under an optional ``prefix``; ``key`` maps to ``prefix/key``."""

    def __init__(
        self, client: Any, bucket: str, prefix: str = "", *, region: str | None = None
    ) -> None:
        if not bucket:
            raise ValueError("S3 bucket name must not be empty")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.region = region or client.meta.region_name

    def __repr__(self) -> str:
        return f"S3Storage(bucket={self.bucket!r}, prefix={self.prefix!r})"

    def object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (for dev/test start-up)."""
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if status != 404 and code not in ("404", "NoSuchBucket", "NotFound"):
                raise
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self.region and self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self.client.create_bucket(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise

    def put_file(self, key: str, path: Path) -> None:
        # upload_file switches to multipart above the threshold; S3 only makes the object
        # visible once the (multipart) upload completes, so readers never see a partial one.
        self.client.upload_file(str(path), self.bucket, self.object_key(key))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data)

    def _get_object(self, key: str, **extra: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.object_key(key), **extra)
        except ClientError as exc:
            if _is_not_found(exc):
                raise ObjectNotFound(key) from None
            raise

    def get_bytes(self, key: str) -> bytes:
        body = self._get_object(key)["Body"]
        try:
            return body.read()
        finally:
            body.close()

    def open_stream(self, key: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        check_chunk_size(chunk_size)
        return _chunks(self._get_object(key)["Body"], chunk_size)

    def open_range(
        self, key: str, start: int, end: int, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[bytes]:
        """Yield bytes ``start..end`` (inclusive) of the object, in chunks."""
        check_chunk_size(chunk_size)
        body = self._get_object(key, Range=f"bytes={start}-{end}")["Body"]
        return _chunks(body, chunk_size)

    def download_file(self, key: str, path: Path) -> None:
        from botocore.exceptions import ClientError

        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{dest.name}.", dir=dest.parent)
        os.close(fd)
        try:
            try:
                self.client.download_file(self.bucket, self.object_key(key), tmp_name)
            except ClientError as exc:
                if _is_not_found(exc):
                    raise ObjectNotFound(key) from None
                raise
            os.replace(tmp_name, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise

    def _head(self, key: str) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
        except ClientError as exc:
            if _is_not_found(exc):
                raise ObjectNotFound(key) from None
            raise

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
        except ObjectNotFound:
            return False
        return True

    def delete(self, key: str) -> None:
        # DeleteObject succeeds for a missing key.
        self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))

    def presigned_url(self, key: str, expires_s: int = 300) -> str | None:
        return str(
            self.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self.object_key(key)},
                ExpiresIn=int(expires_s),
            )
        )

    def ping(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)


def make_s3_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Any:
    """A boto3 S3 client; ``None`` arguments fall back to the standard AWS env vars/config."""
    import boto3
    from botocore.config import Config

    endpoint_url = (
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    s3_options: dict[str, Any] = {}
    if endpoint_url:
        # Custom endpoints (MinIO, moto, Ceph) rarely have per-bucket DNS names.
        s3_options["addressing_style"] = "path"
    config = Config(
        signature_version="s3v4",
        s3=s3_options or None,
        retries={"max_attempts": 4, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
    )
    session = boto3.session.Session(
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        region_name=region,
    )
    return session.client("s3", endpoint_url=endpoint_url, config=config)


def _chunks(body: Any, chunk_size: int) -> Iterator[bytes]:
    """The streaming body in chunks; closed when exhausted or abandoned."""
    try:
        yield from body.iter_chunks(chunk_size)
    finally:
        body.close()
