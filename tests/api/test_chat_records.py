"""Dataset records in the common chat shape `{messages, ...}` (OpenAI's, TRL's), as a JSON body
and as a JSONL file: the prompt is the messages up to the last user turn, the turns after it are
the record's `reference`, the other fields are kept; a malformed one names its field."""

from __future__ import annotations

import json

import httpx

from tests.api.helpers import error_paths, problem

SYSTEM = {"role": "system", "content": "Answer with a number."}
USER = {"role": "user", "content": "What is 2 + 3?"}
ANSWER = {"role": "assistant", "content": "5"}


def _records(client: httpx.Client, dataset_id: str) -> list[dict]:
    r = client.get(f"/v1/datasets/{dataset_id}/records")
    assert r.status_code == 200, r.text
    return [row["record"] for row in r.json()["data"]]


def test_messages_records_become_prompts(client: httpx.Client) -> None:
    records = [
        {"messages": [SYSTEM, USER, ANSWER], "answer": 5},
        {"messages": [USER], "answer": 5},
        {"prompt": "Digit 3:", "messages": "a field like any other"},
    ]
    r = client.post("/v1/datasets", json={"name": "chat", "records": records})
    assert r.status_code == 201, r.text
    assert _records(client, r.json()["id"]) == [
        {"prompt": [SYSTEM, USER], "answer": 5, "reference": [ANSWER]},
        {"prompt": [USER], "answer": 5},
        {"prompt": "Digit 3:", "messages": "a field like any other"},
    ]
    lines = "\n".join(json.dumps(x) for x in records[:2]).encode()
    r = client.post("/v1/datasets", data={"name": "chat-file"}, files={"file": ("c.jsonl", lines)})
    assert r.status_code == 201, r.text
    assert _records(client, r.json()["id"])[0]["prompt"] == [SYSTEM, USER]


def test_malformed_messages_name_the_field(client: httpx.Client) -> None:
    cases = {
        "$.records[0].messages": {"messages": [SYSTEM, ANSWER]},  # no user turn
        "$.records[1].messages": {"messages": [{"role": "user"}]},
        "$.records[2].messages": {"messages": []},
        "$.records[3].reference": {"messages": [USER, ANSWER], "reference": "taken"},
    }
    r = client.post("/v1/datasets", json={"name": "bad-chat", "records": list(cases.values())})
    problem(r, 422)
    assert error_paths(r) == list(cases)
    assert "no user turn" in r.json()["errors"][0]["message"]
