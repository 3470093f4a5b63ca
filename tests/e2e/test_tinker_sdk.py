"""The Tinker-compatible API (docs/tinker.md) driven by the official `tinker` SDK, unchanged:
a real API process and a real `grpo-service tinker-worker` on the tiny model, the SDK pointed at
them with `base_url` and a `tml-` key of ours."""

from __future__ import annotations

import subprocess
import tarfile
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import httpx
import pytest
import tinker
from selenium import webdriver
from selenium.webdriver.common.by import By
from tinker import types

from service.supervisor import serve_command
from tests.api.server import run_api
from tests.e2e.services import TINY, RunningService, _spawn, free_port, stop_all
from tests.ui.browser import PageWait, browser, chromium, console_errors, wait_for

__all__ = ["browser", "chromium"]  # the fixtures


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    """The API, a tinker worker and (for /v1/completions on a sampler path) serve."""
    work = tmp_path_factory.mktemp("tinker")
    serve_port = free_port()
    env = {
        # Short: the worker's first request (torch, the model) outlasts it, so the SDK meets
        # `try_again` answers and polls again.
        "GRPO_TINKER_LONG_POLL_S": "1",
        "GRPO_TINKER_WORKER_POLL_S": "0.05",
        "GRPO_INFERENCE_URL": f"http://127.0.0.1:{serve_port}",
        "GRPO_INFERENCE_TOKEN": "tinker-serve-token",
    }
    with run_api(env, work, tiny_model_dir) as api:
        api.procs.append(start_worker(api))
        with (work / "serve.log").open("wb") as log:
            serve = subprocess.Popen(serve_command("127.0.0.1", serve_port), env=api.env,
                                     stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            yield api
        finally:
            stop_all([*api.procs[1:], serve], timeout=20)


def start_worker(api: RunningService) -> subprocess.Popen[bytes]:
    log = api.log_dir / f"tinker-worker-{len(api.procs)}.log"
    return _spawn(["tinker-worker", "--device", "cpu"], api.env, log)


def client_for(svc: RunningService, tenant: str) -> tinker.ServiceClient:
    return tinker.ServiceClient(base_url=svc.base_url, api_key="tml-" + svc.new_key(tenant))


@pytest.fixture(scope="module")
def alice(svc: RunningService) -> Iterator[tinker.ServiceClient]:
    client = client_for(svc, "tinker-alice")
    yield client
    client.close("success").result()


def datum(tokens: list[int]) -> types.Datum:
    """Next-token prediction over `tokens`: input all but the last, targets all but the first."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


BATCH = [datum([5, 9, 13, 17, 21, 25, 29, 33]), datum([7, 11, 15, 19, 23, 27])]
ADAM = types.AdamParams(learning_rate=5e-3)


def loss_of(out: types.ForwardBackwardOutput) -> float:
    return out.metrics["loss:sum"]


def test_capabilities_list_the_catalog(alice: tinker.ServiceClient) -> None:
    models = alice.get_server_capabilities().supported_models
    assert [m.model_name for m in models] == [TINY]


def test_supervised_steps_lower_the_loss_and_state_resumes_exactly(
    alice: tinker.ServiceClient, svc: RunningService
) -> None:
    trainer = alice.create_lora_training_client(base_model=TINY, rank=4, seed=1).result()
    info = trainer.get_info()
    assert (info.model_name, info.lora_rank, info.is_lora) == (TINY, 4, True)
    assert trainer.get_tokenizer().decode([40, 41]) == "AB"  # the catalog model's own
    first = loss_of(trainer.forward(BATCH, "cross_entropy").result())
    for _ in range(4):
        fb = trainer.forward_backward(BATCH, "cross_entropy")
        trainer.optim_step(ADAM).result()
        out = fb.result()
        assert len(out.loss_fn_outputs) == 2
        assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == 7
    after = loss_of(trainer.forward(BATCH, "cross_entropy").result())
    assert after < first - 0.05, (first, after)

    saved = trainer.save_state("mid").result().path
    assert saved == f"tinker://{trainer.model_id}/weights/mid"
    trainer.forward_backward(BATCH, "cross_entropy").result()
    trainer.optim_step(ADAM).result()
    expected = loss_of(trainer.forward(BATCH, "cross_entropy").result())

    resumed = alice.create_training_client_from_state_with_optimizer(saved).result()
    assert resumed.model_id != trainer.model_id
    resumed_loss = loss_of(resumed.forward(BATCH, "cross_entropy").result())
    assert resumed_loss == pytest.approx(after, abs=1e-6)
    resumed.forward_backward(BATCH, "cross_entropy").result()
    resumed.optim_step(ADAM).result()
    assert loss_of(resumed.forward(BATCH, "cross_entropy").result()) == pytest.approx(
        expected, abs=1e-6
    )

    rest = alice.create_rest_client()
    listed = rest.list_checkpoints(trainer.model_id).result().checkpoints
    assert [c.tinker_path for c in listed] == [saved]
    runs = rest.list_training_runs().result().training_runs
    assert {trainer.model_id, resumed.model_id} <= {r.training_run_id for r in runs}


def test_sampling_and_sampler_weights(alice: tinker.ServiceClient, svc: RunningService) -> None:
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    trainer.forward_backward(BATCH, "cross_entropy").result()
    trainer.optim_step(ADAM).result()
    path = trainer.save_weights_for_sampler("s1").result().path
    assert path == f"tinker://{trainer.model_id}/sampler_weights/s1"

    sampler = alice.create_sampling_client(model_path=path).result()
    params = types.SamplingParams(max_tokens=5, temperature=1.0, seed=3)
    prompt = types.ModelInput.from_ints([5, 9, 13])
    out = sampler.sample(prompt, num_samples=3, sampling_params=params,
                         include_prompt_logprobs=True).result()  # fmt: skip
    assert len(out.sequences) == 3
    for seq in out.sequences:
        assert 1 <= len(seq.tokens) <= 5 and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == 3

    base = alice.create_sampling_client(base_model=TINY).result()
    again = base.sample(prompt, num_samples=1, sampling_params=params).result()
    assert len(again.sequences) == 1

    # The download: a peft adapter directory in one tar.
    run, kind, name = path.removeprefix("tinker://").split("/")
    key = alice.holder._api_key  # the tml- key the client was made with
    r = httpx.get(f"{svc.base_url}/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/archive",
                  headers={"X-API-Key": key})  # fmt: skip
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=BytesIO(r.content)) as tar:
        names = tar.getnames()
    assert "adapter_config.json" in names and "adapter_model.safetensors" in names


def test_bad_input_is_an_sdk_error_and_the_worker_keeps_serving(
    alice: tinker.ServiceClient,
) -> None:
    with pytest.raises(tinker.BadRequestError, match="unknown model"):
        alice.create_lora_training_client(base_model="no-such-model", rank=4).result()
    with pytest.raises(tinker.BadRequestError, match="rank"):
        alice.create_lora_training_client(base_model=TINY, rank=100_000).result()
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    with pytest.raises(tinker.BadRequestError, match="loss_fn"):
        trainer.forward_backward(BATCH, "stable_reinforce").result()
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    short = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                        loss_fn_inputs={"target_tokens": [2, 3]})  # fmt: skip
    with pytest.raises(tinker.BadRequestError, match="2 values for 3 input tokens"):
        trainer.forward_backward([short], "cross_entropy").result()
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    with pytest.raises(tinker.BadRequestError, match="outside"):
        trainer.forward_backward([datum([1, 2, 10**7])], "cross_entropy").result()
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    with pytest.raises(tinker.BadRequestError, match="over the context"):
        trainer.forward_backward([datum([5] * 2000)], "cross_entropy").result()
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    assert loss_of(trainer.forward_backward(BATCH, "cross_entropy").result()) > 0


def test_a_client_side_custom_loss_runs_over_forward_and_cross_entropy(
    alice: tinker.ServiceClient,
) -> None:
    """forward_backward_custom without create_custom_loss (the SDK's default): a `forward`, the
    loss C computed here, then cross_entropy with weights -dC/d logprobs. With C the summed
    negative log-likelihood, those weights are 1: the surrogate is the cross-entropy itself."""
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    expected = loss_of(trainer.forward(BATCH, "cross_entropy").result())

    def nll(data: list[types.Datum], logprobs: list) -> tuple:  # logprobs: torch tensors (T,)
        loss = sum((-lp).sum() for lp in logprobs)
        return loss, {"tokens": float(sum(len(lp) for lp in logprobs))}

    out = trainer.forward_backward_custom(BATCH, nll).result()
    assert loss_of(out) == pytest.approx(expected, rel=1e-5)
    assert out.metrics["surrogate_loss:sum"] == pytest.approx(expected, rel=1e-5)
    assert out.metrics["tokens"] == 7 + 5
    trainer.optim_step(ADAM).result()
    assert loss_of(trainer.forward(BATCH, "cross_entropy").result()) < expected


def completion(svc: RunningService, key: str, model: str) -> httpx.Response:
    """POST /v1/completions, once serve answers (it starts beside the module's API)."""
    deadline = time.monotonic() + 60
    while True:
        with svc.client(key) as http:
            r = http.post("/v1/completions", json={"model": model, "prompt": "ab", "max_tokens": 3})
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def test_tenants_stay_apart(alice: tinker.ServiceClient, svc: RunningService) -> None:
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    path = trainer.save_weights_for_sampler("mine").result().path
    # The sampler path is a model of its tenant's /v1/completions (on serve), no one else's.
    served = completion(svc, alice.holder._api_key.removeprefix("tml-"), path)
    assert served.status_code == 200, served.text
    assert served.json()["model"] == path and served.json()["choices"][0]["text"] is not None
    stranger = completion(svc, svc.new_key("tinker-dave"), path)
    assert stranger.status_code == 404 and stranger.json()["error"]["code"] == "model_not_found"
    bob = client_for(svc, "tinker-bob")
    try:
        bob_rest = bob.create_rest_client()
        for call in (
            lambda: bob_rest.get_training_run(trainer.model_id).result(),
            lambda: bob_rest.list_checkpoints(trainer.model_id).result(),
            lambda: bob.create_sampling_client(model_path=path).result(),
        ):
            with pytest.raises(tinker.NotFoundError):
                call()
        with pytest.raises(tinker.NotFoundError):
            bob_rest.get_training_run("tks_0000000000:train:0").result()
    finally:
        bob.close("success").result()


def test_unsupported_routes_answer_501(alice: tinker.ServiceClient, svc: RunningService) -> None:
    r = httpx.post(f"{svc.base_url}/api/v1/copy_weights", json={},
                   headers={"X-API-Key": alice.holder._api_key})  # fmt: skip
    assert r.status_code == 501 and "not supported" in r.json()["detail"]


def test_a_finished_sessions_heartbeat_is_gone(svc: RunningService) -> None:
    """The SDK ends its heartbeat loop on a 410 (`close` finishes the session); another
    tenant's session reads as missing."""
    key = svc.new_key("tinker-finisher")
    headers = {"X-API-Key": "tml-" + key}
    session_id = httpx.post(f"{svc.base_url}/api/v1/create_session", json={},
                            headers=headers).json()["session_id"]  # fmt: skip
    beat = {"session_id": session_id}
    assert httpx.post(f"{svc.base_url}/api/v1/session_heartbeat", json=beat,
                      headers=headers).status_code == 200  # fmt: skip
    other = {"X-API-Key": "tml-" + svc.new_key("tinker-stranger")}
    finish = f"{svc.base_url}/api/v1/sessions/{session_id}/finish"
    assert httpx.post(finish, json={}, headers=other).status_code == 404
    assert httpx.post(finish, json={}, headers=headers).status_code == 200
    gone = httpx.post(f"{svc.base_url}/api/v1/session_heartbeat", json=beat, headers=headers)
    assert gone.status_code == 410 and "has finished" in gone.json()["detail"]


def even_share(tokens: list[int]) -> float:
    """The verifier: the share of even token ids in a completion."""
    return sum(t % 2 == 0 for t in tokens) / max(len(tokens), 1)


def test_an_rl_loop_with_importance_sampling_raises_the_reward(
    alice: tinker.ServiceClient,
) -> None:
    """Sample from the current weights, score, centre the rewards in the group, and train on the
    sampled tokens with the sampler's log-probs (the SDK's rl_loop, on a toy verifier)."""
    trainer = alice.create_lora_training_client(base_model=TINY, rank=8, seed=2).result()
    prompt = [5, 9, 13]
    rewards = []
    for step in range(10):
        params = types.SamplingParams(max_tokens=2, temperature=1.0, stop=[], seed=100 + step)
        sampler = trainer.save_weights_and_get_sampling_client(f"rl-{step}")
        out = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=32,
                             sampling_params=params).result()  # fmt: skip
        scores = [even_share(s.tokens) for s in out.sequences]
        mean = sum(scores) / len(scores)
        rewards.append(mean)
        data = []
        for seq, score in zip(out.sequences, scores, strict=True):
            pad = [0.0] * (len(prompt) - 1)
            data.append(types.Datum(
                model_input=types.ModelInput.from_ints(prompt + seq.tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": prompt[1:] + seq.tokens,
                    "logprobs": pad + seq.logprobs,
                    "advantages": pad + [score - mean] * len(seq.tokens),
                },
            ))  # fmt: skip
        trainer.forward_backward(data, "importance_sampling")
        trainer.optim_step(types.AdamParams(learning_rate=5e-2, grad_clip_norm=1.0)).result()
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.15, rewards


def test_device_time_shows_in_usage_and_a_budget_stops_new_work(svc: RunningService) -> None:
    from service.usage.service import set_budget

    carol = client_for(svc, "tinker-carol")
    try:
        trainer = carol.create_lora_training_client(base_model=TINY, rank=2).result()
        trainer.forward_backward(BATCH, "cross_entropy").result()
        key = carol.holder._api_key.removeprefix("tml-")
        with svc.client(key) as http:
            usage = http.get("/v1/usage", params={"group_by": "job"}).json()
        rows = {row["job_id"]: row for row in usage["data"]}
        assert rows[trainer.model_id]["device_seconds_by_kind"]["tinker"] > 0
        saved = trainer.save_state("before-the-budget").result().path
        sampler = trainer.save_weights_and_get_sampling_client("before-the-budget")
        with svc.session() as session:
            set_budget(session, "tinker-carol", 1e-9)
        params = types.SamplingParams(max_tokens=2)
        calls = {  # every call that queues device work, not only the first of a step
            "forward_backward": lambda: trainer.forward_backward(BATCH, "cross_entropy"),
            "optim_step": lambda: trainer.optim_step(types.AdamParams(learning_rate=1e-3)),
            "save_weights": lambda: trainer.save_state("over-budget"),
            "save_for_sampler": lambda: trainer.save_weights_for_sampler("over-budget"),
            "load_weights": lambda: trainer.load_state(saved),
            "sample": lambda: sampler.sample(types.ModelInput.from_ints([1, 2]), 1, params),
        }
        for name, call in calls.items():
            with pytest.raises(tinker.APIStatusError) as refused:
                call().result()
            assert refused.value.status_code == 402, name
    finally:
        carol.close("success").result()


def test_the_dashboard_lists_runs_and_checkpoints(
    alice: tinker.ServiceClient, svc: RunningService, browser: webdriver.Chrome
) -> None:
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    for _ in range(2):  # two points of the loss curve
        trainer.forward_backward(BATCH, "cross_entropy").result()
    path = trainer.save_weights_for_sampler("shown").result().path
    browser.get(f"{svc.base_url}/ui/tinker")
    key = alice.holder._api_key.removeprefix("tml-")
    browser.execute_script("sessionStorage.setItem(KEY, arguments[0]);", key)
    browser.get(f"{svc.base_url}/ui/tinker")
    row = wait_for(browser, f"#tinker-runs tr[data-run-id='{trainer.model_id}']")
    PageWait(browser, 20).until(lambda d: path in row.text)
    assert TINY in row.text and "sampler" in row.text
    curve = wait_for(browser, f"tr[data-run-id='{trainer.model_id}'] .loss-chart polyline")
    assert curve.get_attribute("data-points") == "2"
    button = row.find_element(By.CSS_SELECTOR, "button.download")
    button.click()  # the archive, fetched with the key: its size once saved
    PageWait(browser, 20).until(lambda d: button.get_attribute("data-bytes"))
    assert int(button.get_attribute("data-bytes")) > 10_000
    assert console_errors(browser) == []
    with svc.client(svc.new_key("tinker-stranger")) as stranger:  # as missing to another tenant
        assert stranger.get(f"/api/v1/training_runs/{trainer.model_id}/loss").status_code == 404


def test_a_restarted_worker_never_resets_a_trained_run(
    alice: tinker.ServiceClient, svc: RunningService
) -> None:
    """The run's state lived in the worker: after a restart its next request fails (it is not
    silently re-initialised) and load_state brings it back exactly."""
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    trainer.forward_backward(BATCH, "cross_entropy").result()
    trainer.optim_step(ADAM).result()
    path = trainer.save_state("before-restart").result().path
    expected = loss_of(trainer.forward(BATCH, "cross_entropy").result())
    stop_all([svc.procs.pop()], timeout=20)
    # No worker: a request waits, and its future says so (the SDK would poll again).
    headers = {"X-API-Key": alice.holder._api_key}
    sample = {"prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 9]}]},
              "sampling_params": {"max_tokens": 2}, "base_model": TINY}  # fmt: skip
    with httpx.Client(base_url=f"{svc.base_url}/api/v1", headers=headers, timeout=30) as http:
        request_id = http.post("/asample", json=sample).json()["request_id"]
        pending = http.post("/retrieve_future", json={"request_id": request_id}).json()
    assert pending["type"] == "try_again" and pending["queue_position"] == 0
    assert pending["queue_state"] == "active" and pending["request_id"] == request_id
    svc.procs.append(start_worker(svc))
    with pytest.raises(
        tinker.RequestFailedError, match=r"state were lost \(its tinker worker restarted"
    ):
        trainer.forward(BATCH, "cross_entropy").result()
    back = alice.create_training_client_from_state_with_optimizer(path).result()
    assert loss_of(back.forward(BATCH, "cross_entropy").result()) == pytest.approx(
        expected, abs=1e-6
    )
