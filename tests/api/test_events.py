"""Job events as JSON and as a live, resumable Server-Sent Events stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.e2e.services import RunningService

SSE = {"Accept": "text/event-stream"}


def frames(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """SSE frames as dicts of their fields; a comment line yields {'comment': text}."""
    frame: dict[str, Any] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
        elif line == "":
            if frame:
                yield frame
            frame = {}
        else:
            name, _, value = line.partition(":")
            frame[name] = value.removeprefix(" ")


def test_sse_follows_a_job_live_then_resumes(api: RunningService, client: httpx.Client) -> None:
    make_verifier(client)
    job = make_job(client, make_dataset(client))
    url = f"/v1/jobs/{job['id']}/events"
    seen: list[dict[str, Any]] = []
    keepalives = 0
    with client.stream("GET", url, headers=SSE, timeout=20) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for frame in frames(r):  # ends by itself once the job is final
            if "comment" in frame:
                keepalives += 1
                if keepalives == 1:  # idle long enough for a keep-alive: now end the job
                    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
            elif "data" in frame:
                event = json.loads(frame["data"])
                assert frame["id"] == str(event["id"]) and frame["event"] == event["type"]
                seen.append(event)
    statuses = [e["data"].get("status") for e in seen if e["type"] == "status"]
    assert statuses == ["queued", "cancelled"]
    assert keepalives >= 1

    first = seen[0]["id"]
    with client.stream("GET", url, headers={**SSE, "Last-Event-ID": str(first)}) as r:
        resumed = [json.loads(f["data"]) for f in frames(r) if "data" in f]
    assert [e["id"] for e in resumed] == [e["id"] for e in seen[1:]]
    page = client.get(url, params={"after": first}).json()
    assert [e["id"] for e in page["data"]] == [e["id"] for e in seen[1:]]
    assert client.get(url).json()["data"] == seen
