"""The serving engine's cancellation (issue 18): a request cancelled while it decodes leaves the
batch at its next token and ends with `Cancelled`, its batch-mates decoding on to the same text
as alone; one cancelled while it waits is never decoded. Real weights: the tiny model."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.inference.engine import Engine
from workers.inference.params import Cancelled, ModelRef, Request, Result, Sampling
from workers.inference.pool import ModelPool

LONG = 900  # of the tiny model's 1024 positions: seconds of decoding on a CPU


class Call:
    """One request and what the engine answered."""

    def __init__(self, ref: ModelRef, prompt: str, max_tokens: int, cancel_at: int = 0) -> None:
        self.done = threading.Event()
        self.deltas = 0
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.request = Request(
            ref, prompt, Sampling(max_tokens=max_tokens, temperature=0),
            on_delta=lambda *_: self._delta(cancel_at),
            on_done=lambda r: self._end(r, None), on_error=lambda e: self._end(None, e),
        )  # fmt: skip

    def _delta(self, cancel_at: int) -> None:
        self.deltas += 1
        if cancel_at and self.deltas >= cancel_at:
            self.request.cancel()  # as serve does when the client goes away

    def _end(self, result: Result | None, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.done.set()

    def wait(self) -> Call:
        assert self.done.wait(300), "the engine never answered"
        return self

    def text(self) -> str:
        assert self.result is not None, self.error
        return self.result.choices[0].text


@pytest.fixture(scope="module")
def ref(tiny_model_dir: Path) -> ModelRef:
    return ModelRef(str(tiny_model_dir), label="tiny")


@pytest.fixture
def engine() -> Iterator[Engine]:
    # a wide window: requests submitted together are decoded in one batch
    engine = Engine(ModelPool(1, 1, device="cpu"), window_s=0.5, max_rows=8)
    yield engine
    engine.close()


def test_a_cancelled_request_leaves_the_batch_and_the_others_decode_on(
    engine: Engine, ref: ModelRef
) -> None:
    alone = Call(ref, "ab", 40)
    engine.submit(alone.request)
    alone.wait()
    tokens = engine.stats.tokens

    gone, mate = Call(ref, "ab", LONG, cancel_at=1), Call(ref, "ab", 40)
    engine.submit(gone.request)
    engine.submit(mate.request)
    assert isinstance(gone.wait().error, Cancelled) and gone.result is None
    assert mate.wait().text() == alone.text()  # unchanged by its batch-mate's leaving
    assert mate.result is not None and mate.result.choices[0].finish_reason == "length"
    assert engine.stats.cancelled == 1 and engine.stats.max_batch_rows == 2
    # the cancelled row decoded a token or two past its first text, not its 900
    assert engine.stats.tokens - tokens - 40 < 10


def test_a_request_cancelled_while_it_waits_is_never_decoded(engine: Engine, ref: ModelRef) -> None:
    first = Call(ref, "cd", LONG, cancel_at=3)
    waiting = Call(ref, "cd", LONG)
    waiting.request.cancel()  # its client went away before the engine took it
    engine.submit(first.request)
    engine.submit(waiting.request)
    assert isinstance(first.wait().error, Cancelled)
    assert isinstance(waiting.wait().error, Cancelled) and waiting.deltas == 0
    assert engine.stats.cancelled == 2 and engine.stats.rows == 1  # only `first` was decoded
    assert engine.stats.tokens < 10
