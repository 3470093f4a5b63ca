"""`/v1/chat/completions` and `/v1/completions` before any backend: bodies validated (422 with
the field's path), models resolved for the tenant (a stranger's checkpoint reads exactly as a
missing one), and a missing or unreachable backend a 503, all through the official SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.api.conftest import served_over_http
from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.api.server import run_api
from tests.api.test_models import seed_checkpoint
from tests.e2e.services import TINY, RunningService, free_port

api = served_over_http()  # the official SDK speaks HTTP


CHAT = [{"role": "user", "content": "hi"}]


def sdk(svc: RunningService, tenant: str | None = None) -> openai.OpenAI:
    key = svc.new_key(tenant or f"inf-{free_port()}")
    return openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def dead_backend(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[RunningService]:
    """An API whose inference backend is down (nothing listens at its URL)."""
    env = {"GRPO_INFERENCE_URL": f"http://127.0.0.1:{free_port()}"}
    with run_api(env, tmp_path_factory.mktemp("dead-backend"), tiny_model_dir) as svc:
        yield svc


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"messages": []}, "$.messages"),
        ({"messages": CHAT, "temperature": 3}, "$.temperature"),
        ({"messages": CHAT, "n": 0}, "$.n"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "$.messages[0].role"),
        ({"messages": CHAT, "max_completion_tokens": 0}, "$.max_completion_tokens"),
        ({"messages": CHAT, "presence_penalty": 1}, "$.presence_penalty"),
    ],
)
def test_bad_chat_bodies_are_422_with_the_path(api: RunningService, body: dict, path: str) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as err:
        sdk(api).chat.completions.create(model=TINY, **body)
    assert path in [e["path"] for e in err.value.response.json()["errors"]]
    assert path in str(err.value)  # the SDK's message names it


def test_bad_completion_bodies_are_422(api: RunningService) -> None:
    client = sdk(api)
    with pytest.raises(openai.UnprocessableEntityError, match="top_logprobs"):
        client.chat.completions.create(model=TINY, messages=CHAT, top_logprobs=2)
    with pytest.raises(openai.UnprocessableEntityError, match=r"\$\.logprobs"):
        client.completions.create(model=TINY, prompt="x", logprobs=9)
    with pytest.raises(openai.UnprocessableEntityError, match=r"\$\.stop"):
        client.completions.create(model=TINY, prompt="x", stop=["a", "b", "c", "d", "e"])


def test_unknown_and_foreign_models_are_404(api: RunningService) -> None:
    owner = api.client(api.new_key("inf-owner"))
    make_verifier(owner)
    job = make_job(owner, make_dataset(owner))
    ckpt = seed_checkpoint(api, job["id"])
    stranger = sdk(api, "inf-stranger")
    missing = "ckpt_0000000000000000000000"
    with pytest.raises(openai.NotFoundError) as theirs:
        stranger.chat.completions.create(model=ckpt, messages=CHAT)
    with pytest.raises(openai.NotFoundError) as absent:
        stranger.chat.completions.create(model=missing, messages=CHAT)
    theirs_body, absent_body = theirs.value.response.json(), absent.value.response.json()
    for body, model in ((theirs_body, ckpt), (absent_body, missing)):
        assert body["detail"].startswith(f"model '{model}' not found")
        body["detail"] = body["error"]["message"] = ""
    assert theirs_body == absent_body
    with pytest.raises(openai.NotFoundError, match="model 'no-such-model' not found"):
        stranger.completions.create(model="no-such-model", prompt="x")


def test_no_backend_configured_is_503(api: RunningService) -> None:
    with pytest.raises(openai.InternalServerError) as err:
        sdk(api).completions.create(model=TINY, prompt="x")
    assert err.value.status_code == 503 and "GRPO_INFERENCE_URL" in str(err.value)


def test_backend_down_is_503(dead_backend: RunningService) -> None:
    client = sdk(dead_backend)
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(model=TINY, messages=CHAT, stream=stream)
        assert err.value.status_code == 503 and "unreachable" in str(err.value)
        assert err.value.response.headers["retry-after"] == "5"
