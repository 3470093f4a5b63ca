"""Pages of a dataset's records (`GET /v1/datasets/{id}/records`), on local storage and S3:
every record once, in order, with or without the line index. On a real API process, eight
pages of a large dataset read at once, far into the file, hold the process's memory to a small
growth (its peak RSS, read from /proc after resetting it), whether the dataset was uploaded
with its line index or stored before the index existed (then built at the first read); and
each page holds exactly the right records."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.datasets import line_index
from service.models import Dataset
from service.storage import open_storage_from_settings
from tests.api.server import run_api, serve_in_process
from tests.e2e.services import RunningService

RECORDS = 120_000  # of ~450 bytes: a 54 MB file, which each page read whole before
PAGE = 100
MIB = 1 << 20
# Eight pages of 100 records and their read buffers; the file is 54 MB.
GROWTH_LIMIT = 24 * MIB


def record(i: int) -> dict[str, Any]:
    return {"prompt": f"Record {i}: " + "é" * 200, "answer": str(i), "n": i}


@pytest.fixture(scope="module")
def big_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    env = {
        "GRPO_MAX_REQUEST_BYTES": str(256 * MIB),
        "GRPO_MAX_DATASET_RECORDS": str(RECORDS),
    }
    with run_api(env, tmp_path_factory.mktemp("dataset-pages")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(big_api: RunningService) -> Iterator[httpx.Client]:
    with big_api.client(big_api.new_key("pages")) as c:
        yield c


@pytest.fixture(scope="module")
def dataset(client: httpx.Client) -> dict[str, Any]:
    lines = (json.dumps(record(i), ensure_ascii=False).encode() + b"\n" for i in range(RECORDS))
    body = b"".join(lines)
    r = client.post(
        "/v1/datasets", data={"name": "big"}, files={"file": ("big.jsonl", body)}, timeout=300
    )
    assert r.status_code == 201, r.text
    return r.json()


def _pid(svc: RunningService) -> int:
    (proc,) = svc.procs
    return proc.pid


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    (line,) = [x for x in status.splitlines() if x.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def _reset_peak(pid: int) -> int:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak RSS starts again from now
    return _peak_rss(pid)


def _page(
    client: httpx.Client, dataset_id: str, after: int | None, limit: int = PAGE
) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit} | ({} if after is None else {"after": str(after)})
    r = client.get(f"/v1/datasets/{dataset_id}/records", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _expected(first: int, last: int) -> list[dict[str, Any]]:
    return [{"id": str(i), "index": i, "record": record(i)} for i in range(first, last)]


def _eight_pages_at_once(svc: RunningService, client: httpx.Client, dataset_id: str) -> int:
    """The peak RSS growth while eight pages near the end are read in parallel."""
    afters = [RECORDS - 1 - PAGE * k - 37 * k for k in range(1, 9)]
    pid = _pid(svc)
    before = _reset_peak(pid)
    with ThreadPoolExecutor(8) as pool:
        pages = list(pool.map(lambda a: _page(client, dataset_id, a), afters))
    growth = _peak_rss(pid) - before
    for after, page in zip(afters, pages, strict=True):
        assert page["data"] == _expected(after + 1, after + 1 + PAGE)
    return growth


def test_pages_are_the_right_records(client: httpx.Client, dataset: dict[str, Any]) -> None:
    ds = dataset["id"]
    first = _page(client, ds, None)
    assert first["data"] == _expected(0, PAGE) and first["has_more"] and first["next"] == "99"
    across = _page(client, ds, line_index.EVERY * 3 - 10)  # across an indexed line
    assert across["data"] == _expected(line_index.EVERY * 3 - 9, line_index.EVERY * 3 + 91)
    last = _page(client, ds, RECORDS - 41)
    assert last["data"] == _expected(RECORDS - 40, RECORDS)
    assert not last["has_more"] and last["next"] is None
    assert _page(client, ds, RECORDS - 1)["data"] == []
    assert _page(client, ds, RECORDS + 5)["data"] == []


def test_eight_pages_at_once_hold_little_memory(
    big_api: RunningService, client: httpx.Client, dataset: dict[str, Any]
) -> None:
    _page(client, dataset["id"], RECORDS // 2)  # what a first request imports or caches
    growth = _eight_pages_at_once(big_api, client, dataset["id"])
    assert growth < GROWTH_LIMIT, f"the API grew by {growth / MIB:.0f} MiB"


def test_a_dataset_stored_before_the_index_pages_as_well(
    big_api: RunningService, client: httpx.Client, dataset: dict[str, Any]
) -> None:
    storage = open_storage_from_settings(big_api.settings())
    with big_api.session() as session:
        row = session.get(Dataset, dataset["id"])
        assert row is not None
        index = line_index.key_for(row.object_key)
    assert storage.exists(index)  # written with the upload
    storage.delete(index)
    growth = _eight_pages_at_once(big_api, client, dataset["id"])  # the first one builds it
    assert growth < GROWTH_LIMIT, f"the API grew by {growth / MIB:.0f} MiB"
    assert storage.exists(index)


@pytest.fixture(scope="module", params=["local", "s3"])
def small_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningService]:
    """The API on local storage, and on S3 (moto): ranged reads of both."""
    env = {"GRPO_MAX_DATASET_RECORDS": "1000"}
    if request.param == "s3":
        env |= {
            "GRPO_STORAGE_URL": f"s3://grpo-pages-{secrets.token_hex(4)}/objects",
            "GRPO_S3_ENDPOINT_URL": request.getfixturevalue("moto_server"),
            "GRPO_S3_REGION": "us-east-1",
            "GRPO_S3_ACCESS_KEY_ID": "testing",
            "GRPO_S3_SECRET_ACCESS_KEY": "testing",
            "GRPO_S3_CREATE_BUCKET": "true",
        }
    with serve_in_process(env, tmp_path_factory.mktemp(f"pages-{request.param}")) as svc:
        yield svc


def test_paging_through_reads_every_record_once(small_api: RunningService) -> None:
    """Through the whole file, with the index and without it (a dataset stored before it)."""
    n = 3 * line_index.EVERY + 5
    with small_api.client(small_api.new_key("paging")) as c:
        lines = [json.dumps(record(i), ensure_ascii=False) for i in range(n)]
        r = c.post("/v1/datasets", data={"name": "small"},
                   files={"file": ("small.jsonl", "\n".join(lines).encode())})  # fmt: skip
        assert r.status_code == 201, r.text
        ds = r.json()["id"]
        storage = open_storage_from_settings(small_api.settings())
        with small_api.session() as session:
            row = session.get(Dataset, ds)
            assert row is not None
            index = line_index.key_for(row.object_key)
        for indexed in (True, False):
            if not indexed:
                storage.delete(index)
            seen, after = [], None
            while True:
                page = _page(c, ds, after, limit=70)
                seen += page["data"]
                if not page["has_more"]:
                    break
                after = int(page["next"])
            assert seen == _expected(0, n)
            assert storage.exists(index)  # written with the upload, or by the first read
