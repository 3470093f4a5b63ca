"""The API's checks of a Tinker request before it queues one: the loss names, their inputs and
config, and the limits are the engine's (workers/losses/registry.py, workers/tinker/types.py),
so what the API accepts the engine runs, and what it refuses names the field the engine names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service.core.problems import ProblemError
from service.models import CatalogModel
from service.tinker import futures, schemas, service
from workers.losses.registry import CLIENT_SIDE_CUSTOM, REFUSED, SPECS
from workers.tinker.types import MAX_LORA_RANK, MAX_SAMPLES

MODEL = CatalogModel(name="tiny", vocab_size=50, context_length=16)
TOKENS = [3, 4, 5]


def refused(call: Callable[[], Any]) -> tuple[str, str]:
    """The field a 400 names, and its message."""
    with pytest.raises(ProblemError) as err:
        call()
    problem = err.value.problem
    assert problem.status == 400
    return problem.errors[0].path, problem.errors[0].message


def forward_backward(loss: str, inputs: dict[str, list], config: dict | None = None) -> None:
    body = {"loss_fn": loss, "loss_fn_config": config,
            "data": [{"tokens": TOKENS, "loss_fn_inputs": inputs}]}  # fmt: skip
    futures.check_forward_backward(body, MODEL)


def inputs_of(names: tuple[str, ...]) -> dict[str, list]:
    return {name: [4, 5, 6] if name == "target_tokens" else [0.5] * 3 for name in names}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_registered_loss_is_accepted_and_each_missing_input_named(name: str) -> None:
    spec = SPECS[name]
    forward_backward(name, inputs_of(spec.required))
    forward_backward(name, inputs_of(spec.inputs), dict(spec.config))
    for missing in spec.required:
        without = inputs_of(tuple(n for n in spec.required if n != missing))
        field, message = refused(lambda without=without: forward_backward(name, without))
        assert (field, message) == (f"data[0].loss_fn_inputs.{missing}", f"{name} needs it")


def test_refused_losses_config_and_inputs_name_their_field() -> None:
    field, message = refused(lambda: forward_backward("nll", inputs_of(("target_tokens",))))
    assert field == "loss_fn" and "one of ['cispo', 'cross_entropy'" in message
    for name in REFUSED:
        assert refused(lambda name=name: forward_backward(name, {}))[0] == "loss_fn"
    _, message = refused(lambda: forward_backward("custom", {}))
    assert "client-side" in message and CLIENT_SIDE_CUSTOM in message
    rl = inputs_of(SPECS["ppo"].required)
    assert refused(lambda: forward_backward("ppo", rl, {"clip_lo": 0.9}))[0] == (
        "loss_fn_config.clip_lo"
    )
    assert refused(lambda: forward_backward("cross_entropy", rl | {"wieghts": [1.0] * 3}))[0] == (
        "data[0].loss_fn_inputs.wieghts"
    )
    short = {"target_tokens": [4, 5]}
    assert refused(lambda: forward_backward("cross_entropy", short)) == (
        "data[0].loss_fn_inputs.target_tokens",
        "has 2 values for 3 input tokens",
    )
    outside = {"target_tokens": [4, 5, 50]}
    field, message = refused(lambda: forward_backward("cross_entropy", outside))
    assert field == "data[0].loss_fn_inputs.target_tokens[2]" and "outside" in message
    long = {
        "loss_fn": "cross_entropy",
        "data": [{"tokens": [3] * 17, "loss_fn_inputs": {"target_tokens": [3] * 17}}],
    }
    field, message = refused(lambda: futures.check_forward_backward(long, MODEL))
    assert field == "data[0].model_input" and "over the context" in message


def test_the_limits_are_the_engines() -> None:
    service.check_lora(schemas.LoraConfigIn(rank=MAX_LORA_RANK))
    too_big = schemas.LoraConfigIn(rank=MAX_LORA_RANK + 1)
    assert refused(lambda: service.check_lora(too_big))[0] == "lora_config.rank"
    params = schemas.SamplingParamsIn(max_tokens=4)
    futures.check_sample(TOKENS, MAX_SAMPLES, params, MODEL)
    many = MAX_SAMPLES + 1
    assert refused(lambda: futures.check_sample(TOKENS, many, params, MODEL))[0] == "num_samples"
    no_max = schemas.SamplingParamsIn()
    assert refused(lambda: futures.check_sample(TOKENS, 1, no_max, MODEL))[0] == (
        "sampling_params.max_tokens"
    )
    over = schemas.SamplingParamsIn(max_tokens=MODEL.context_length)
    field, message = refused(lambda: futures.check_sample(TOKENS, 1, over, MODEL))
    assert field == "sampling_params.max_tokens" and "context" in message
