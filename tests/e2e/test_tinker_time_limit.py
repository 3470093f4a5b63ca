"""A Tinker request past GRPO_TINKER_REQUEST_TIMEOUT_S is stopped, not run to its end (issue 46
item 2): a real API and a real tinker worker, driven by the official `tinker` SDK. The engine
stops a forward_backward at its next micro-batch and a sample at its next decoding step; the
future fails saying so (the SDK's RequestFailedError), the run is as before the request, and the
worker goes on with the next request."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from tinker import types

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_tinker_fairness import target_only
from tests.e2e.test_tinker_lease import WAIT_S, requests_of
from tests.e2e.test_tinker_sdk import ADAM, BATCH, client_for, loss_of
from tests.e2e.tinker_services import tinker_service

LIMIT_S = 1


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    limit = {"GRPO_TINKER_REQUEST_TIMEOUT_S": str(LIMIT_S)}
    with tinker_service(tmp_path_factory.mktemp("tinker-limit"), tiny_model_dir, limit) as api:
        yield api


def test_a_request_past_the_time_limit_is_stopped_and_the_run_is_as_before(
    svc: RunningService,
) -> None:
    client = client_for(svc, "limit")
    try:
        trainer = client.create_lora_training_client(base_model=TINY, rank=2, seed=3).result()
        twin = client.create_lora_training_client(base_model=TINY, rank=2, seed=3).result()
        trainer.forward_backward(BATCH, "cross_entropy").result(WAIT_S)  # pending gradients
        # 16 x 1000 tokens: 4 micro-batches of 4 data, each over a second on a CPU
        long = [target_only(1000, i) for i in range(16)]
        with pytest.raises(tinker.RequestFailedError) as stopped:
            trainer.forward_backward(long, "cross_entropy").result(WAIT_S)
        said = r"forward_backward stopped after (\d) of 4 micro-batches, past its time limit of 1 s"
        found = re.search(said + ": nothing it computed was kept", str(stopped.value))
        assert found, str(stopped.value)
        assert int(found.group(1)) < 4  # stopped, not run to its end
        assert "GRPO_TINKER_REQUEST_TIMEOUT_S" in str(stopped.value)

        # the worker goes on, and the run kept only the gradients of before the request
        trainer.optim_step(ADAM).result(WAIT_S)
        twin.forward_backward(BATCH, "cross_entropy").result(WAIT_S)
        twin.optim_step(ADAM).result(WAIT_S)
        after = loss_of(trainer.forward(BATCH, "cross_entropy").result(WAIT_S))
        assert after == pytest.approx(loss_of(twin.forward(BATCH, "cross_entropy").result(WAIT_S)),
                                      abs=1e-6)  # fmt: skip

        sampler = client.create_sampling_client(base_model=TINY).result()
        params = types.SamplingParams(max_tokens=1000, stop=[], seed=1)
        prompt = types.ModelInput.from_ints([5, 9, 13])
        with pytest.raises(tinker.RequestFailedError, match=r"sample stopped after \d+ of 1000 "
                           "decoding steps, past its time limit"):  # fmt: skip
            sampler.sample(prompt, num_samples=16, sampling_params=params).result(WAIT_S)
        short = types.SamplingParams(max_tokens=4, seed=1)
        assert len(sampler.sample(prompt, 2, short).result(WAIT_S).sequences) == 2

        failed = [r for r in requests_of(svc, "limit") if r["status"] == "failed"]
        assert [(r["kind"], r["error"]["category"]) for r in failed] == [
            ("forward_backward", "user"),
            ("sample", "user"),
        ]
    finally:
        client.close("success").result()
