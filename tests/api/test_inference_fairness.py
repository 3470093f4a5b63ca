"""Fairness between tenants on `/v1/completions` and `/v1/chat/completions`, through the official
SDK against a backend over real HTTP that holds the requests it is told to: one tenant over its
concurrency waits in its queue, beyond the queue gets a 429 with Retry-After, while another
tenant's request is served at once; the queued request is served once a slot frees, a stream
holds its slot until it ends, and a request over the token budget is a 422 naming the field.
The order in which freed slots go round the tenants: tests/service/test_inference_scheduler.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest

from tests.api.server import run_api
from tests.e2e.services import TINY, RunningService, free_port

HOLD = "hold me"  # a prompt the backend answers only once released
CONCURRENCY = 2
QUEUE = 1  # requests of one tenant waiting for a slot
TOKEN_BUDGET = 1000


class HoldingBackend:
    """Answers completions at once, or, for HOLD, once `release` is set; counts those held."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = 0
        self.lock = threading.Lock()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                prompt = body.get("prompt") or body["messages"][-1]["content"]
                if prompt == HOLD:
                    with backend.lock:
                        backend.held += 1
                    backend.release.wait(30)
                if body.get("stream"):
                    self._stream(body)
                    return
                choice = {"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}
                self._send(200, "application/json", json.dumps({
                    "id": "cmpl-x", "object": "text_completion", "created": 1,
                    "model": body["model"], "choices": [choice],
                }).encode())  # fmt: skip

            def _stream(self, body: dict) -> None:
                choice = {"index": 0, "text": "ok", "finish_reason": "stop"}
                chunk = {"id": "cmpl-x", "object": "text_completion", "created": 1,
                         "model": body["model"], "choices": [choice]}  # fmt: skip
                events = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
                self._send(200, "text/event-stream", events.encode())

            def _send(self, status: int, kind: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_held(self, count: int) -> None:
        deadline = time.monotonic() + 20
        while self.held < count:
            assert time.monotonic() < deadline, f"{self.held} requests held, not {count}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def backend() -> Iterator[HoldingBackend]:
    holding = HoldingBackend()
    thread = threading.Thread(target=holding.server.serve_forever, daemon=True)
    thread.start()
    yield holding
    holding.release.set()
    holding.server.shutdown()


@pytest.fixture(scope="module")
def fair_api(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, backend: HoldingBackend
) -> Iterator[RunningService]:
    env = {
        "GRPO_INFERENCE_URL": backend.url,
        "GRPO_INFERENCE_TENANT_CONCURRENCY": str(CONCURRENCY),
        "GRPO_INFERENCE_TENANT_QUEUE": str(QUEUE),
        "GRPO_INFERENCE_QUEUE_WAIT_S": "30",  # longer than the test holds the slots
        "GRPO_INFERENCE_MAX_TOKENS_PER_REQUEST": str(TOKEN_BUDGET),
    }
    with run_api(env, tmp_path_factory.mktemp("fair-inference"), tiny_model_dir) as svc:
        yield svc


def sdk(svc: RunningService, tenant: str) -> openai.OpenAI:
    key = svc.new_key(f"{tenant}-{free_port()}")
    return openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key=key, max_retries=0, timeout=30)


def test_a_tenant_over_its_concurrency_queues_and_another_is_served(
    fair_api: RunningService, backend: HoldingBackend
) -> None:
    greedy, other = sdk(fair_api, "greedy"), sdk(fair_api, "other")
    with ThreadPoolExecutor(CONCURRENCY + QUEUE + 1) as pool:
        plain = pool.submit(greedy.completions.create, model=TINY, prompt=HOLD, max_tokens=8)
        streamed = pool.submit(
            lambda: list(greedy.completions.create(model=TINY, prompt=HOLD, stream=True))
        )
        backend.wait_held(CONCURRENCY)
        # two more at once: whichever comes first waits in the queue, the other is refused
        more = [
            pool.submit(greedy.completions.create, model=TINY, prompt="one more", max_tokens=8)
            for _ in range(QUEUE + 1)
        ]
        done, _ = wait(more, timeout=20, return_when=FIRST_COMPLETED)
        (refused,) = done
        (queued,) = [f for f in more if f is not refused]
        with pytest.raises(openai.RateLimitError) as err:
            refused.result()
        assert err.value.response.headers["retry-after"] == "1"
        assert "the limits are 2 running and 1 waiting" in err.value.response.json()["detail"]
        start = time.monotonic()
        answer = other.completions.create(model=TINY, prompt="quick", max_tokens=8)
        assert answer.choices[0].text == "ok" and time.monotonic() - start < 5
        assert not queued.done()  # still waiting for one of its tenant's slots
        backend.release.set()
        assert plain.result().choices[0].text == "ok"
        assert streamed.result()[0].choices[0].text == "ok"
        assert queued.result().choices[0].text == "ok"  # served once a slot freed
    # both slots came back, the stream's once it ended
    for _ in range(CONCURRENCY + 1):
        assert greedy.completions.create(model=TINY, prompt="again", max_tokens=8).choices


@pytest.mark.parametrize(
    ("create", "path"),
    [
        (lambda c: c.completions.create(model=TINY, prompt="x", max_tokens=100, n=16),
         "$.max_tokens"),
        (lambda c: c.completions.create(model=TINY, prompt=["x"] * 4, max_tokens=300, n=1),
         "$.max_tokens"),
        (lambda c: c.chat.completions.create(model=TINY, n=2, max_completion_tokens=501,
                                             messages=[{"role": "user", "content": "x"}]),
         "$.max_completion_tokens"),
        (lambda c: c.chat.completions.create(model=TINY, n=4, max_tokens=251,
                                             messages=[{"role": "user", "content": "x"}]),
         "$.max_tokens"),
    ],
)  # fmt: skip
def test_a_request_over_the_token_budget_names_the_field(
    fair_api: RunningService, create: object, path: str
) -> None:
    client = sdk(fair_api, "budget")
    with pytest.raises(openai.APIStatusError) as err:
        create(client)  # type: ignore[operator]
    assert err.value.status_code in (400, 422)
    problem = err.value.response.json()
    assert [e["path"] for e in problem["errors"]] == [path], problem
    assert f"limit of {TOKEN_BUDGET} per request" in problem["detail"]
    within = client.completions.create(model=TINY, prompt="x", max_tokens=62, n=16)
    assert within.choices  # 992 tokens: within the budget
