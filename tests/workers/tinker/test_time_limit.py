"""A request's time limit in the engine (workers.tinker.types.Deadline): a forward_backward past
it stops at its next micro-batch, the rest never run, and the run's pending gradients are as
before the request; a sample stops at its next decoding step. The model is made slow by a
forward hook that sleeps (a slow device), and counts the forwards that did run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from tests.workers.tinker.test_host import sft_batch, train
from workers.tinker import batches
from workers.tinker.types import Deadline, LoraConfig, SamplingParams, TimeLimitExceeded

SLOW_S = 0.8  # one slow forward
LIMIT_S = 0.5  # past after one slow forward, not before it


@contextmanager
def slow_forwards(model: Any, slow_from: int = 0) -> Iterator[list[int]]:
    """Counts the model's forwards; from the `slow_from`-th on (0-based), each takes SLOW_S."""
    calls: list[int] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        if len(calls) >= slow_from:
            time.sleep(SLOW_S)
        calls.append(1)

    handle = model.register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def test_a_forward_backward_past_its_deadline_stops_and_keeps_nothing(
    make_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = make_host()
    host.create_run("a", LoraConfig(rank=4))
    train(host, "a", 1)  # B != 0: every matrix gets a gradient
    host.forward_backward("a", sft_batch(host), "cross_entropy")  # pending gradients
    params = host.adapters.parameters(host._runs["a"].name)
    pending = [p.grad.clone() for p in params]
    monkeypatch.setattr(batches, "MICRO_BATCH_TOKENS", 1)  # one datum a micro-batch: 3
    with slow_forwards(host.model) as calls, pytest.raises(TimeLimitExceeded) as stopped:
        host.forward_backward("a", sft_batch(host), "cross_entropy", None,
                              Deadline.after(LIMIT_S))  # fmt: skip
    assert len(calls) == 1  # the first micro-batch ran; the two after it never started
    assert str(stopped.value) == (
        "stopped after 1 of 3 micro-batches, past its time limit of 0.5 s: nothing it "
        "computed was kept"
    )
    for p, g in zip(params, pending, strict=True):
        assert torch.equal(p.grad, g)  # the first micro-batch's gradients were taken back
    with slow_forwards(host.model) as calls, pytest.raises(TimeLimitExceeded):
        host.forward("a", sft_batch(host), "cross_entropy", None, Deadline.after(LIMIT_S))
    assert len(calls) == 1
    within = host.forward_backward("a", sft_batch(host), "cross_entropy", None,
                                   Deadline.after(60))  # fmt: skip
    assert len(within.loss_fn_outputs) == 3  # a deadline not reached changes nothing


def test_a_sample_past_its_deadline_stops_at_its_next_decoding_step(make_host: Any) -> None:
    host = make_host()
    prompt = host.tokenizer("abc=")["input_ids"]
    params = SamplingParams(max_tokens=8, seed=1, stop=[])
    # the prefill and the first draw in time; the first decoding forward is slow
    with slow_forwards(host.model, slow_from=1) as calls, pytest.raises(TimeLimitExceeded) as x:
        host.sample(None, prompt, 2, params, deadline=Deadline.after(LIMIT_S))
    assert len(calls) == 2
    assert str(x.value).startswith("stopped after 1 of 8 decoding steps")
    assert len(host.sample(None, prompt, 2, params, deadline=Deadline.after(60)).sequences) == 2
