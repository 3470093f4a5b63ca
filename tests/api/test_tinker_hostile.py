"""A hostile tenant on the Tinker surface (issue 46 items 8 and 10), driven by the official
`tinker` SDK against a real API process on PostgreSQL (no worker: each refusal is at
submission). NaN, Infinity and NUL in the values the SDK sends are a 422 naming the field (they
were 500s: PostgreSQL's json and text refuse them); a finished session takes no more requests
(410); user_metadata is bounded (docs/tinker.md)."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
from tinker import types

from tests.api.server import run_api
from tests.e2e.conftest import fresh_database
from tests.e2e.services import TINY, RunningService

INPUTS = {"target_tokens": [9, 13, 17], "weights": [1.0] * 3}
BATCH = [types.Datum(model_input=types.ModelInput.from_ints([5, 9, 13]), loss_fn_inputs=INPUTS)]
PROMPT = types.ModelInput.from_ints([5, 9, 13])
PARAMS = types.SamplingParams(max_tokens=2)
WAIT_S = 60


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    # the default body limit: room for 20 MB of metadata
    env = {"GRPO_TINKER_LONG_POLL_S": "1", "GRPO_MAX_REQUEST_BYTES": str(64 << 20)}
    with fresh_database("grpo_tinker_hostile") as url:
        work = tmp_path_factory.mktemp("tinker-hostile")
        with run_api({**env, "GRPO_DATABASE_URL": url}, work, tiny_model_dir) as api:
            yield api


@pytest.fixture()
def key(svc: RunningService) -> str:
    return svc.new_key(f"tinker-{secrets.token_hex(4)}")  # a tenant of the test's own


@pytest.fixture()
def client(svc: RunningService, key: str) -> Iterator[tinker.ServiceClient]:
    service_client = tinker.ServiceClient(base_url=svc.base_url, api_key=f"tml-{key}")
    yield service_client
    service_client.close("success").result()


def refused(call: Callable[[], Any], status: int) -> dict[str, Any]:
    """The problem the SDK raised for `call`, which must have been answered `status`."""
    with pytest.raises(tinker.APIStatusError) as err:
        call()
    assert err.value.status_code == status, err.value
    body = err.value.body
    assert isinstance(body, dict) and body["status"] == status, body
    return body


def rest(svc: RunningService, key: str) -> tinker.RestClient:
    return tinker.RestClient(base_url=svc.base_url, api_key=f"tml-{key}")


def paths(problem: dict[str, Any]) -> list[str]:
    return [e["path"] for e in problem.get("errors") or []]


# Item 8: values PostgreSQL cannot keep, in the fields the SDK fills


def test_non_finite_numbers_and_nul_in_sdk_requests_are_422s(
    client: tinker.ServiceClient,
) -> None:
    nul = refused(lambda: client.create_lora_training_client(
        base_model=TINY, rank=2, user_metadata={"note": "a\x00b"}).result(), 422)  # fmt: skip
    assert paths(nul) == ["$.user_metadata.note"]
    trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
    adam = types.AdamParams(learning_rate=math.inf)
    assert paths(refused(lambda: trainer.optim_step(adam).result(WAIT_S), 422)) == [
        "$.adam_params.learning_rate"
    ]
    stop = types.SamplingParams(max_tokens=2, stop=["\x00"])
    sampler = client.create_sampling_client(base_model=TINY).result()
    problem = refused(lambda: sampler.sample(PROMPT, 1, stop).result(WAIT_S), 422)
    assert paths(problem) == ["$.sampling_params.stop[0]"]
    saved = refused(lambda: trainer.save_state("ok", user_metadata={"k": "\x00"}).result(), 422)
    assert paths(saved) == ["$.user_metadata.k"]


# Item 10: a finished session


def _finish(svc: RunningService, key: str, session_id: str) -> None:
    url = f"{svc.base_url}/api/v1/sessions/{session_id}/finish"
    r = httpx.post(url, headers={"X-API-Key": f"tml-{key}"}, json={"reason": {"type": "success"}})
    assert r.status_code == 200, r.text


def test_a_finished_session_takes_no_more_requests(
    client: tinker.ServiceClient, svc: RunningService, key: str
) -> None:
    trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
    sampler = client.create_sampling_client(base_model=TINY).result()
    tml = {"X-API-Key": f"tml-{key}"}
    queued = httpx.post(f"{svc.base_url}/api/v1/optim_step", headers=tml,
                        json={"model_id": trainer.model_id}).json()["request_id"]  # fmt: skip
    session_id = trainer.model_id.split(":")[0]  # <session>:train:<n>, as the SDK derives it
    _finish(svc, key, session_id)  # as another process of the tenant's would

    calls = {
        "forward_backward": lambda: trainer.forward_backward(BATCH, "cross_entropy").result(WAIT_S),
        "optim_step": lambda: trainer.optim_step(types.AdamParams()).result(WAIT_S),
        "save_state": lambda: trainer.save_state("late").result(WAIT_S),
        "save_weights_for_sampler": lambda: trainer.save_weights_for_sampler("late").result(WAIT_S),
        "sample": lambda: sampler.sample(PROMPT, 1, PARAMS).result(WAIT_S),
        "create_lora_training_client": lambda: client.create_lora_training_client(
            base_model=TINY, rank=2).result(),
        "create_sampling_client": lambda: client.create_sampling_client(base_model=TINY).result(),
    }  # fmt: skip
    for name, call in calls.items():
        problem = refused(call, 410)
        assert problem["detail"].startswith(f"session '{session_id}' has finished"), (name, problem)
    # what it did before stays readable
    assert trainer.get_info().model_id == trainer.model_id
    runs = rest(svc, key).list_training_runs().result().training_runs
    assert trainer.model_id in {r.training_run_id for r in runs}
    r = httpx.post(f"{svc.base_url}/api/v1/retrieve_future", headers=tml,
                   json={"request_id": queued}, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text  # its future still answers (no worker: try_again)


# Item 10: user_metadata's limits


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"k": "x" * 20_000_000}, "the value of 'k' has 20000000 characters; the limit is 4096"),
        ({f"k{i}": "v" for i in range(65)}, "65 keys; the limit is 64"),
        ({"k" * 129: "v"}, "a key of 129 characters; the limit is 128"),
        (
            {f"k{i}": "v" * 4000 for i in range(5)},
            "20010 bytes of keys and values; the limit is 16384",
        ),
    ],
    ids=["20-MB-value", "65-keys", "long-key", "over-16-KiB"],
)
def test_user_metadata_over_its_limits_is_a_422_at_submission(
    client: tinker.ServiceClient, svc: RunningService, key: str, metadata: dict, message: str
) -> None:
    created = refused(
        lambda: client.create_lora_training_client(
            base_model=TINY, rank=2, user_metadata=metadata
        ).result(),
        422,
    )
    assert created["errors"] == [{"path": "$.user_metadata", "message": message}]
    trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
    saved = refused(lambda: trainer.save_state("s", user_metadata=metadata).result(WAIT_S), 422)
    assert saved["errors"] == [{"path": "$.user_metadata", "message": message}]
    runs = rest(svc, key).list_training_runs().result().training_runs
    assert [r.user_metadata for r in runs] == [None]  # nothing of it was stored
    session = tinker.ServiceClient(base_url=svc.base_url, api_key=f"tml-{key}",
                                   user_metadata=metadata)  # fmt: skip
    try:  # the session's own metadata: refused when the SDK creates the session
        opened = refused(
            lambda: session.create_lora_training_client(base_model=TINY, rank=2).result(), 422
        )
        assert opened["errors"] == [{"path": "$.user_metadata", "message": message}]
    finally:
        session.close("errored").result()


def test_user_metadata_at_its_limits_is_kept(
    client: tinker.ServiceClient, svc: RunningService, key: str
) -> None:
    # 64 keys of 4 characters and values of 252: 64 * 256 = 16384 bytes
    metadata = {f"k{i:03d}": "v" * 252 for i in range(64)}
    trainer = client.create_lora_training_client(
        base_model=TINY, rank=2, user_metadata=metadata
    ).result()
    run = rest(svc, key).get_training_run(trainer.model_id).result()
    assert run.user_metadata == metadata
