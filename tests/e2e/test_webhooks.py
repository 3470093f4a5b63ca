"""Webhooks end to end: a real tiny job's events reach a real local receiver, signed (checked
with the `standardwebhooks` package, an independent implementation); a failing receiver gets
the same message until it answers 2xx; the outbox survives the dispatcher being down."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook as Verifier

from tests.api.server import run_api
from tests.e2e.services import TINY, RunningService, run_service
from tests.e2e.test_training_flow import submit_digit_job, wait_final
from tests.e2e.webhook_receiver import Receiver, run_receiver

# Private targets (the receiver is on 127.0.0.1), a quick dispatcher and quick retries.
ENV = {
    "GRPO_WEBHOOK_ALLOW_PRIVATE": "true",
    "GRPO_WEBHOOK_POLL_S": "0.2",
    "GRPO_WEBHOOK_RETRY_BASE_S": "0.3",
}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with run_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RunningService]:
    with run_service(ENV, tmp_path_factory.mktemp("webhooks"), embedded=True,
                     model=tiny_model_dir) as svc:  # fmt: skip
        yield svc


def _subscribe(client: httpx.Client, url: str, events: list[str]) -> dict:
    r = client.post("/v1/webhooks", json={"url": url, "events": events})
    assert r.status_code == 201, r.text
    return r.json()


def _deliveries_once(
    client: httpx.Client, hook_id: str, settled: Callable[[list], bool], timeout: float = 15.0
) -> list:
    """The delivery log once `settled(log)` holds: the dispatcher records a 2xx only after the
    receiver has answered, so a log read the moment the receiver returns can lag behind it."""
    deadline = time.monotonic() + timeout
    while True:
        log = client.get(f"/v1/webhooks/{hook_id}/deliveries").json()["data"]
        if settled(log) or time.monotonic() > deadline:
            return log
        time.sleep(0.1)


def _all_delivered(log: list) -> bool:
    return bool(log) and all(d["status"] == "delivered" for d in log)


def _types(receiver: Receiver, path: str) -> list[str]:
    return [json.loads(r.body)["type"] for r in receiver.got(path)]


def test_a_jobs_events_arrive_signed(service: RunningService, receiver: Receiver) -> None:
    client = service.client(service.new_key("hooked"))
    hook = _subscribe(client, f"{receiver.base_url}/job", ["*"])
    job = submit_digit_job(client, TINY)  # 4 steps, a checkpoint every 2
    assert wait_final(client, job["id"])["status"] == "succeeded", service.logs()
    receiver.wait_for(lambda _: "job.succeeded" in _types(receiver, "/job"), timeout=30)
    verifier = Verifier(hook["secret"])
    seen = []
    for request in receiver.got("/job"):
        payload = verifier.verify(request.body, request.headers)  # raises if the signature is bad
        assert payload["data"]["job_id"] == job["id"] and payload["timestamp"].endswith("Z")
        seen.append((payload["timestamp"], payload["type"], payload["data"].get("step")))
    # concurrent sends may arrive out of order: the event's own time orders them
    seen = [(t, step) for _, t, step in sorted(seen, key=lambda s: datetime.fromisoformat(s[0]))]
    assert seen[0] == ("job.queued", None) and seen[1][0] == "job.running"
    assert ("job.checkpoint", 2) in seen and ("job.checkpoint", 4) in seen
    assert seen[-1][0] == "job.succeeded" and len(seen) == 5, seen
    forged = dict(receiver.got("/job")[0].headers, **{"webhook-id": "msg_forged"})
    with pytest.raises(Exception, match="[Ss]ignature"):
        verifier.verify(receiver.got("/job")[0].body, forged)
    log = _deliveries_once(client, hook["id"], lambda d: len(d) == 5 and _all_delivered(d))
    assert len(log) == 5 and {(d["status"], d["attempts"]) for d in log} == {("delivered", 1)}


def test_a_failing_receiver_gets_the_same_message_until_it_accepts(
    service: RunningService, receiver: Receiver
) -> None:
    client = service.client(service.new_key("flaky"))
    receiver.script["/flaky"] = [500, 500]  # then 200
    hook = _subscribe(client, f"{receiver.base_url}/flaky", ["job.succeeded"])
    queued = client.post(f"/v1/webhooks/{hook['id']}/test").json()
    got = receiver.wait_for(lambda g: len([r for r in g if r.path == "/flaky"]) >= 3)
    ids = [r.headers["webhook-id"] for r in got if r.path == "/flaky"]
    assert ids == [queued["id"]] * 3
    verifier = Verifier(hook["secret"])
    assert all(verifier.verify(r.body, r.headers)["type"] == "webhook.test"
               for r in receiver.got("/flaky"))  # fmt: skip
    (row,) = _deliveries_once(client, hook["id"], _all_delivered)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("delivered", 3, 200)
    assert row["delivered_at"] and row["next_attempt_at"] is None


def test_the_outbox_survives_the_dispatcher_being_down(tmp_path: Path, receiver: Receiver) -> None:
    """Queued while only the API runs (no dispatcher), delivered once the service is back."""
    with run_api(ENV, tmp_path) as api:
        client = api.client(api.new_key("patient"))
        hook = _subscribe(client, f"{receiver.base_url}/later", ["*"])
        queued = client.post(f"/v1/webhooks/{hook['id']}/test").json()
    assert receiver.got("/later") == []
    with run_service(ENV, tmp_path, embedded=True) as svc:
        receiver.wait_for(lambda g: any(r.path == "/later" for r in g), timeout=30)
        client = svc.client(svc.new_key("patient"))
        (row,) = _deliveries_once(client, hook["id"], _all_delivered)
        assert row["id"] == queued["id"] and row["status"] == "delivered"
    (request,) = receiver.got("/later")
    assert Verifier(hook["secret"]).verify(request.body, request.headers)["type"] == "webhook.test"
