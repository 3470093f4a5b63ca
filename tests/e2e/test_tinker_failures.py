"""A Tinker request's failure fails that request alone (issue 46, item 1): a real API process on
PostgreSQL (whose json refuses NaN and Infinity) and a real tinker worker, driven by the official
`tinker` SDK. Values that are not finite are refused by the engine, the run left as it was; a
temperature below the greedy floor samples greedily."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from tinker import types

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_tinker_sdk import BATCH, client_for, datum, loss_of
from tests.e2e.tinker_services import tinker_service

WAIT_S = 120  # a future the worker never finishes would hang the SDK: fail instead


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    with tinker_service(tmp_path_factory.mktemp("tinker-pg"), tiny_model_dir, {}) as api:
        yield api


def worker_alive(svc: RunningService) -> bool:
    return svc.procs[1].poll() is None


def overflowing(tokens: list[int]) -> types.Datum:
    """Loss weights of 3e38: each finite, their sum over the tokens overflows float32."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [3e38] * (len(tokens) - 1)},
    )


def test_a_loss_that_overflows_fails_its_request_alone_and_leaves_the_run_as_it_was(
    svc: RunningService,
) -> None:
    attacker, victim = client_for(svc, "tinker-b"), client_for(svc, "tinker-a")
    try:
        bad = attacker.create_lora_training_client(base_model=TINY, rank=2, seed=7).result()
        twin = attacker.create_lora_training_client(base_model=TINY, rank=2, seed=7).result()
        with pytest.raises(tinker.RequestFailedError, match="not finite"):
            bad.forward_backward([overflowing([5, 9, 13, 17, 21])], "cross_entropy").result(
                timeout=WAIT_S
            )
        assert worker_alive(svc), svc.logs()
        # The other tenant is served; the refused batch left no gradient behind: the run then
        # trains exactly as its twin, which never saw it.
        trainer = victim.create_lora_training_client(base_model=TINY, rank=2).result()
        assert loss_of(trainer.forward_backward(BATCH, "cross_entropy").result(WAIT_S)) > 0
        for run in (bad, twin):
            run.forward_backward(BATCH, "cross_entropy").result(WAIT_S)
            run.optim_step(types.AdamParams(learning_rate=5e-3)).result(WAIT_S)
        after = [loss_of(r.forward(BATCH, "cross_entropy").result(WAIT_S)) for r in (bad, twin)]
        assert math.isfinite(after[0]) and after[0] == pytest.approx(after[1], abs=1e-6)
    finally:
        attacker.close("success").result()
        victim.close("success").result()


def test_a_step_that_would_overflow_the_weights_is_refused_and_undone(
    svc: RunningService,
) -> None:
    client = client_for(svc, "tinker-c")
    try:
        trainer = client.create_lora_training_client(base_model=TINY, rank=2, seed=3).result()
        before = loss_of(trainer.forward(BATCH, "cross_entropy").result(WAIT_S))
        trainer.forward_backward(BATCH, "cross_entropy").result(WAIT_S)
        with pytest.raises(tinker.RequestFailedError, match="not finite"):
            trainer.optim_step(types.AdamParams(learning_rate=3e38)).result(WAIT_S)
        assert worker_alive(svc), svc.logs()
        assert loss_of(trainer.forward(BATCH, "cross_entropy").result(WAIT_S)) == before
    finally:
        client.close("success").result()


def test_a_temperature_below_the_floor_samples_greedily(svc: RunningService) -> None:
    client = client_for(svc, "tinker-d")
    try:
        sampler = client.create_sampling_client(base_model=TINY).result()
        prompt = types.ModelInput.from_ints([5, 9, 13])

        def sample(temperature: float) -> types.SampleResponse:
            params = types.SamplingParams(max_tokens=6, temperature=temperature, stop=[], seed=1)
            return sampler.sample(prompt, num_samples=2, sampling_params=params).result(WAIT_S)

        tiny, greedy = sample(1e-45), sample(0.0)
        assert [s.tokens for s in tiny.sequences] == [s.tokens for s in greedy.sequences]
        for seq in tiny.sequences:
            assert all(math.isfinite(lp) and lp <= 0 for lp in seq.logprobs), seq.logprobs
        assert worker_alive(svc), svc.logs()
        # and the service still trains after it
        trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
        assert loss_of(trainer.forward([datum([5, 9, 13])], "cross_entropy").result(WAIT_S)) > 0
    finally:
        client.close("success").result()
