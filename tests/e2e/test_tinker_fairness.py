"""One tenant's big Tinker work does not hold up another's small request (issue 46 item 2): a
real API on PostgreSQL and a real tinker worker, driven by the official `tinker` SDK. A request
over a cap is refused at submission (413, the SDK raises it naming the field and the limit);
the SDK splits a big forward_backward into requests within the caps (the server's
client/config), and another tenant's small request runs after at most one of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tinker
from tinker import types

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_tinker_lease import WAIT_S, requests_of, wait_until_running
from tests.e2e.test_tinker_sdk import BATCH, client_for
from tests.e2e.tinker_services import tinker_service

PER_DATUM, PER_REQUEST = 1000, 4000


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    caps = {"GRPO_TINKER_MAX_TOKENS_PER_DATUM": str(PER_DATUM),
            "GRPO_TINKER_MAX_TOKENS_PER_REQUEST": str(PER_REQUEST)}  # fmt: skip
    with tinker_service(tmp_path_factory.mktemp("tinker-fair"), tiny_model_dir, caps) as api:
        yield api


def target_only(tokens: int, shift: int = 0) -> types.Datum:
    """`tokens` input tokens, cross-entropy on the next ones (no weights: the SDK counts 12
    bytes a token, so its chunks are exactly at the token cap)."""
    ids = [(7 * j + shift) % 90 + 5 for j in range(tokens + 1)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[1:]}
    )


def tokens_of(request: dict[str, Any]) -> int:
    return sum(len(d["tokens"]) for d in request["payload"]["data"])


def test_a_request_over_a_cap_is_refused_and_the_sdk_says_which(svc: RunningService) -> None:
    client = client_for(svc, "caps")
    try:
        trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
        with pytest.raises(tinker.APIStatusError) as refused:
            trainer.forward_backward([target_only(PER_DATUM + 1)], "cross_entropy").result(WAIT_S)
        assert refused.value.status_code == 413
        assert "data[0].model_input: 1001 tokens, over the limit of 1000 a datum " in str(
            refused.value
        )
        assert "GRPO_TINKER_MAX_TOKENS_PER_DATUM" in str(refused.value)
        sampler = client.create_sampling_client(base_model=TINY).result()
        params = types.SamplingParams(max_tokens=600)
        prompt = types.ModelInput.from_ints([5, 9, 13])
        with pytest.raises(tinker.APIStatusError) as refused:
            sampler.sample(prompt, num_samples=8, sampling_params=params).result(WAIT_S)
        assert refused.value.status_code == 413
        assert "num_samples: 8 samples x 603 tokens = 4824 tokens, over the limit of 4000" in str(
            refused.value
        )
        queued = [r["kind"] for r in requests_of(svc, "caps")]
        assert queued == ["create_model"], "a refused request is never queued"
    finally:
        client.close("success").result()


def test_a_small_request_waits_behind_at_most_one_request_of_another_tenant(
    svc: RunningService,
) -> None:
    """b calls forward_backward on 4 x the token cap; once its first request runs, a sends one
    small batch: a runs after b's running request, before the rest of b's call."""
    a_client, b_client = client_for(svc, "turns-a"), client_for(svc, "turns-b")
    try:
        a = a_client.create_lora_training_client(base_model=TINY, rank=2).result()
        b = b_client.create_lora_training_client(base_model=TINY, rank=2).result()
        b.forward_backward(BATCH, "cross_entropy").result(WAIT_S)  # the worker loads the model
        before = len(requests_of(svc, "turns-b"))
        data = [target_only(PER_DATUM, i) for i in range(4 * PER_REQUEST // PER_DATUM)]
        big = b.forward_backward(data, "cross_entropy")
        wait_until_running(svc, "turns-b", before)
        a.forward_backward(BATCH, "cross_entropy").result(WAIT_S)
        assert len(big.result(WAIT_S).loss_fn_outputs) == len(data)  # the SDK joined them

        b_requests = requests_of(svc, "turns-b")[before:]
        assert [tokens_of(r) for r in b_requests] == [PER_REQUEST] * 4  # split at the cap
        (a_request,) = [r for r in requests_of(svc, "turns-a") if r["kind"] == "forward_backward"]
        waited_behind = [
            r
            for r in b_requests
            if r["started_at"] < a_request["started_at"]
            and r["finished_at"] > a_request["created_at"]
        ]
        assert len(waited_behind) == 1, [(r["started_at"], r["finished_at"]) for r in b_requests]
        assert sum(tokens_of(r) for r in waited_behind) <= PER_REQUEST
        assert a_request["started_at"] >= waited_behind[0]["finished_at"]
    finally:
        a_client.close("success").result()
        b_client.close("success").result()
