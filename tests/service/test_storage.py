"""Tests for service.storage, run against both backends: a local directory and S3 (moto server)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from service.storage import (
    InvalidKey,
    LocalStorage,
    ObjectNotFound,
    ObjectStorage,
    S3Storage,
    open_storage,
)
from service.storage import local as local_mod

CREDS: dict[str, str] = {
    "region": "us-east-1",
    "access_key_id": "testing",
    "secret_access_key": "testing",
}
MB = 1 << 20


def _s3(endpoint: str, url: str) -> S3Storage:
    store = open_storage(url, endpoint_url=endpoint, **CREDS)
    assert isinstance(store, S3Storage)
    return store


def _new_bucket() -> str:
    return f"test-{uuid.uuid4().hex[:20]}"


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStorage:
    if backend == "local":
        return open_storage(f"file://{tmp_path / 'store'}")
    endpoint: str = request.getfixturevalue("moto_server")
    s3 = _s3(endpoint, f"s3://{_new_bucket()}/some/prefix")
    s3.ensure_bucket()
    return s3


def _payload(n: int, seed: int = 0) -> bytes:
    """Deterministic, non-repeating-ish bytes (so chunk mix-ups would be noticed)."""
    block = bytes((i * 31 + seed) % 251 for i in range(4096))
    reps, rest = divmod(n, len(block))
    return block * reps + block[:rest]


# --- behaviour shared by both backends -------------------------------------------------------


def test_implements_protocol(store: ObjectStorage) -> None:
    assert isinstance(store, ObjectStorage)


def test_put_get_bytes(store: ObjectStorage) -> None:
    store.put_bytes("a/b/c.bin", b"hello world")
    assert store.get_bytes("a/b/c.bin") == b"hello world"
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""
    assert store.size("empty") == 0


def test_put_file_and_download_file(store: ObjectStorage, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = _payload(300_000, seed=3)
    src.write_bytes(data)
    store.put_file("jobs/1/adapter.safetensors", src)
    assert store.get_bytes("jobs/1/adapter.safetensors") == data

    dest = tmp_path / "out" / "nested" / "adapter.safetensors"
    store.download_file("jobs/1/adapter.safetensors", dest)
    assert dest.read_bytes() == data
    # Downloading again replaces the file, and no temp files are left behind.
    dest.write_bytes(b"stale")
    store.download_file("jobs/1/adapter.safetensors", dest)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["adapter.safetensors"]


def test_open_stream_chunks_large_file(store: ObjectStorage, tmp_path: Path) -> None:
    # 9 MiB + a bit: above boto3's 8 MiB multipart threshold, so S3 goes multipart.
    size = 9 * MB + 12345
    data = _payload(size, seed=7)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    store.put_file("big/ckpt.bin", src)
    assert store.size("big/ckpt.bin") == size

    stream = store.open_stream("big/ckpt.bin", chunk_size=MB)
    chunks = list(stream)
    assert all(0 < len(c) <= MB for c in chunks)
    assert len(chunks) >= 10
    assert b"".join(chunks) == data

    small = list(store.open_stream("big/ckpt.bin", chunk_size=3 * MB))
    assert all(len(c) <= 3 * MB for c in small)
    assert b"".join(small) == data


def test_open_stream_partial_consumption(store: ObjectStorage) -> None:
    store.put_bytes("s.bin", _payload(5000))
    stream = store.open_stream("s.bin", chunk_size=1000)
    assert next(stream) == _payload(5000)[:1000]
    stream.close()  # type: ignore[attr-defined]  # generators release the file/connection
    with pytest.raises(ValueError):
        store.open_stream("s.bin", chunk_size=0)


def test_size_exists_delete(store: ObjectStorage) -> None:
    assert not store.exists("x/y.txt")
    store.put_bytes("x/y.txt", b"12345")
    assert store.exists("x/y.txt")
    assert store.size("x/y.txt") == 5
    # A "directory" is not an object.
    assert not store.exists("x")
    store.delete("x/y.txt")
    assert not store.exists("x/y.txt")
    store.delete("x/y.txt")  # deleting a missing key is fine
    store.delete("never/existed")


def test_missing_object_raises(store: ObjectStorage, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound) as info:
        store.get_bytes("nope/missing.bin")
    assert isinstance(info.value, KeyError)
    assert info.value.key == "nope/missing.bin"
    with pytest.raises(ObjectNotFound):
        store.size("nope/missing.bin")
    # open_stream fails when called, not on first iteration.
    with pytest.raises(ObjectNotFound):
        store.open_stream("nope/missing.bin")
    dest = tmp_path / "dl" / "missing.bin"
    with pytest.raises(ObjectNotFound):
        store.download_file("nope/missing.bin", dest)
    assert not dest.exists()
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []  # no temp files left


def test_overwrite(store: ObjectStorage, tmp_path: Path) -> None:
    store.put_bytes("k", b"old content that is longer")
    store.put_bytes("k", b"new")
    assert store.get_bytes("k") == b"new"
    assert store.size("k") == 3
    src = tmp_path / "f"
    src.write_bytes(b"from file")
    store.put_file("k", src)
    assert store.get_bytes("k") == b"from file"


def test_concurrent_readers_never_see_partial_objects(store: ObjectStorage) -> None:
    a, b = _payload(256 * 1024, seed=1), _payload(200 * 1024, seed=2)
    store.put_bytes("hot", a)
    stop = threading.Event()
    bad: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            got = store.get_bytes("hot")
            if got not in (a, b):
                bad.append(len(got))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(30):
            store.put_bytes("hot", a if i % 2 else b)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not bad


@pytest.mark.parametrize(
    "key",
    ["", "/etc/passwd", "../escape", "a/../../b", "a/../b", "./a", "a//b", "a/", "a\\b", "a\0b"],
)
def test_invalid_keys_rejected(store: ObjectStorage, key: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidKey):
        store.put_bytes(key, b"x")
    with pytest.raises(InvalidKey):
        store.get_bytes(key)
    with pytest.raises(InvalidKey):
        store.exists(key)
    with pytest.raises(InvalidKey):
        store.delete(key)
    assert not (tmp_path / "escape").exists()


def test_ping(store: ObjectStorage) -> None:
    store.ping()


def test_presigned_url(store: ObjectStorage, backend: str) -> None:
    store.put_bytes("dl/file.txt", b"presigned payload")
    url = store.presigned_url("dl/file.txt", expires_s=60)
    if backend == "local":
        assert url is None
        return
    assert url is not None
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200
    assert resp.content == b"presigned payload"


# --- local backend specifics -----------------------------------------------------------------


def test_local_layout_and_no_temp_files(tmp_path: Path) -> None:
    store = open_storage(str(tmp_path / "root"))  # plain path
    assert isinstance(store, LocalStorage)
    store.put_bytes("a/b.txt", b"1")
    store.put_bytes("a/b.txt", b"2")
    assert (tmp_path / "root" / "a" / "b.txt").read_bytes() == b"2"
    assert os.listdir(tmp_path / "root" / "a") == ["b.txt"]


def test_local_failed_write_keeps_old_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStorage(tmp_path)
    store.put_bytes("obj", b"original")
    src = tmp_path / "src"
    src.write_bytes(b"replacement" * 1000)

    def broken_copy(fsrc: object, fdst: object, length: int = 0) -> None:
        fdst.write(b"partial")  # type: ignore[attr-defined]
        raise OSError("disk on fire")

    monkeypatch.setattr(local_mod.shutil, "copyfileobj", broken_copy)
    with pytest.raises(OSError, match="disk on fire"):
        store.put_file("obj", src)
    assert store.get_bytes("obj") == b"original"
    assert sorted(os.listdir(tmp_path)) == ["obj", "src"]


def test_local_symlink_escape_rejected(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    store = LocalStorage(root)
    (root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidKey):
        store.put_bytes("link/x", b"x")
    assert list(outside.iterdir()) == []


def test_local_ping_fails_when_root_removed(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "root")
    store.ping()
    (tmp_path / "root").rmdir()
    with pytest.raises(OSError):
        store.ping()


@pytest.mark.parametrize(
    "url",
    ["file:///tmp/x", "file://localhost/tmp/x", "/tmp/x"],
)
def test_open_storage_local_urls(url: str, tmp_path: Path) -> None:
    url = url.replace("/tmp/x", str(tmp_path / "x"))
    store = open_storage(url)
    assert isinstance(store, LocalStorage)
    assert store.root == (tmp_path / "x").resolve()


@pytest.mark.parametrize("url", ["", "ftp://host/x", "s3://", "file://otherhost/x", "file:rel"])
def test_open_storage_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        open_storage(url)


# --- S3 backend specifics --------------------------------------------------------------------


def test_s3_url_parsing_and_prefix_isolation(moto_server: str) -> None:
    bucket = _new_bucket()
    plain = _s3(moto_server, f"s3://{bucket}")
    assert (plain.bucket, plain.prefix) == (bucket, "")
    plain.ensure_bucket()
    one = _s3(moto_server, f"s3://{bucket}/tenants/one/")
    two = _s3(moto_server, f"s3://{bucket}/tenants/two")
    assert one.prefix == "tenants/one"
    one.put_bytes("k", b"1")
    two.put_bytes("k", b"2")
    assert one.get_bytes("k") == b"1"
    assert two.get_bytes("k") == b"2"
    assert plain.get_bytes("tenants/one/k") == b"1"
    assert not plain.exists("k")


def test_s3_ensure_bucket_and_ping(moto_server: str) -> None:
    store = _s3(moto_server, f"s3://{_new_bucket()}/p")
    with pytest.raises(Exception):  # noqa: B017 - any botocore error is fine for /readyz
        store.ping()
    store.ensure_bucket()
    store.ensure_bucket()  # idempotent
    store.ping()


def test_s3_ping_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = _s3(f"http://127.0.0.1:{port}", "s3://bucket")
    with pytest.raises(Exception):  # noqa: B017
        store.ping()


def test_s3_client_falls_back_to_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "envkey")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    store = open_storage(f"s3://{_new_bucket()}")
    assert isinstance(store, S3Storage)
    creds = store.client._request_signer._credentials
    assert creds.access_key == "envkey"
    assert store.client.meta.region_name == "us-east-1"
    assert store.client.meta.endpoint_url == moto_server
    store.ensure_bucket()
    store.put_bytes("k", b"v")
    assert store.get_bytes("k") == b"v"
