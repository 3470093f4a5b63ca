"""`/v1/files` through the official `openai` SDK against a real API process (issue 18 item 2):
upload, list with pagination, retrieve, content, delete; bad lines named by number; a file
is one of the tenant's datasets; another tenant's file is missing."""

from __future__ import annotations

import io
import json
import secrets
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.api.conftest import served_over_http
from tests.e2e.services import RunningService

api = served_over_http()  # the official SDK speaks HTTP


def rft_lines(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "developer", "content": "Answer with one digit."},
                {"role": "user", "content": f"Digit {i}:"},
            ],
            "answer": str(i),
            "tags": ["digits", {"é": i}],
        }
        for i in range(start, start + n)
    ]


def jsonl(lines: list[Any]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


def upload(sdk: OpenAI, lines: list[Any], name: str = "train.jsonl") -> Any:
    return sdk.files.create(file=(name, io.BytesIO(jsonl(lines))), purpose="fine-tune")


def sdk_for(api: RunningService) -> OpenAI:
    key = api.new_key(f"files-{secrets.token_hex(4)}")
    return OpenAI(base_url=f"{api.base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def sdk(api: RunningService) -> Iterator[OpenAI]:
    with sdk_for(api) as client:
        yield client


def test_upload_retrieve_content_and_the_dataset_behind_it(
    api: RunningService, sdk: OpenAI
) -> None:
    lines = rft_lines(3)
    created = upload(sdk, lines, "digits.jsonl")
    assert created.object == "file" and created.id.startswith("file-")
    assert (created.filename, created.purpose, created.status) == (
        "digits.jsonl",
        "fine-tune",
        "processed",
    )
    assert isinstance(created.created_at, int)

    content = sdk.files.content(created.id).read()
    assert [json.loads(line) for line in content.splitlines()] == lines
    assert created.bytes == len(content)
    assert sdk.files.retrieve(created.id).to_dict() == created.to_dict()

    # the file IS a dataset: our own route reads the same records
    dataset_id = created.model_extra["dataset"]
    with api.client(sdk.api_key) as client:
        dataset = client.get(f"/v1/datasets/{dataset_id}").json()
    assert dataset_id == "ds_" + created.id.removeprefix("file-")
    assert dataset["num_records"] == 3 and dataset["name"] == "digits.jsonl"


def test_list_pages_with_the_sdk_iterator(api: RunningService) -> None:
    with sdk_for(api) as sdk:
        ids = [upload(sdk, rft_lines(1, i), f"f{i}.jsonl").id for i in range(5)]
        first = sdk.files.list(limit=2)
        assert [f.id for f in first.data] == ids[::-1][:2] and first.has_more is True
        assert [f.id for f in sdk.files.list(limit=2)] == ids[::-1]  # auto-paging, `after`
        last = sdk.files.list(limit=2, after=ids[1])
        assert [f.id for f in last.data] == [ids[0]] and last.has_more is False
        assert [f.id for f in sdk.files.list(purpose="fine-tune", limit=100).data] == ids[::-1]


def test_delete(sdk: OpenAI) -> None:
    created = upload(sdk, rft_lines(1))
    deleted = sdk.files.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "file", True)
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(created.id)
    assert created.id not in [f.id for f in sdk.files.list(limit=100).data]


@pytest.mark.parametrize(
    ("line", "path", "message"),
    [
        ("not json", "$.file.line[2]", "line 2: invalid JSON"),
        ({"prompt": "Digit 1:", "answer": "1"}, "$.file.line[2].messages",
         "'messages' is required"),
        ({"messages": [], "answer": "1"}, "$.file.line[2].messages", "non-empty list"),
        ({"messages": [{"role": "user"}]}, "$.file.line[2].messages[0]", "content: str"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
         "$.file.line[2].messages[1]", "must not be the assistant's"),
        ({"messages": [{"role": "user", "content": "q"}], "prompt": "x"},
         "$.file.line[2].prompt", "reserved"),
    ],
)  # fmt: skip
def test_a_bad_line_is_named_by_number(sdk: OpenAI, line: Any, path: str, message: str) -> None:
    good = rft_lines(1)[0]
    data = jsonl([good]) + (line.encode() + b"\n" if isinstance(line, str) else jsonl([line]))
    with pytest.raises(openai.BadRequestError) as info:
        sdk.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="fine-tune")
    error = info.value.body
    assert isinstance(error, dict) and info.value.param == path.removeprefix("$.")
    assert info.value.type == "invalid_request_error" and message in error["message"]
    # still a problem: the same body carries problem+json's members
    problem = info.value.response.json()
    assert problem["status"] == 400 and problem["errors"][0]["path"] == path
    assert info.value.response.headers["content-type"].startswith("application/problem+json")


def test_the_wrong_purpose_is_a_400(sdk: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.files.create(file=("x.jsonl", io.BytesIO(jsonl(rft_lines(1)))), purpose="batch")
    assert info.value.param == "purpose" and "fine-tune" in str(info.value)


def test_another_tenants_file_is_missing(api: RunningService, sdk: OpenAI) -> None:
    mine = upload(sdk, rft_lines(1)).id
    missing = "file-0000000000000000000000"
    with sdk_for(api) as stranger:
        for call in (
            stranger.files.retrieve,
            stranger.files.content,
            stranger.files.delete,
        ):
            with pytest.raises(openai.NotFoundError) as theirs:
                call(mine)
            with pytest.raises(openai.NotFoundError) as absent:
                call(missing)
            assert theirs.value.message.replace(mine, "ID") == absent.value.message.replace(
                missing, "ID"
            )
        assert stranger.files.list().data == []
    assert sdk.files.retrieve(mine).id == mine
