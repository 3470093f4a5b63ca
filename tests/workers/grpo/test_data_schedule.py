import math

import pytest

from workers.grpo.data import PromptStream
from workers.grpo.schedule import lr_multiplier


def test_stream_covers_each_epoch_and_reshuffles() -> None:
    stream = PromptStream(5, seed=1)
    first, second = stream.take(5), stream.take(5)
    assert sorted(first) == sorted(second) == [0, 1, 2, 3, 4]
    assert first != second  # a new permutation per epoch


def test_stream_resumes_from_its_state() -> None:
    a = PromptStream(7, seed=3)
    a.take(9)
    b = PromptStream(7, seed=3)
    b.load_state_dict(a.state_dict())
    assert a.take(6) == b.take(6)


def test_empty_dataset_is_refused() -> None:
    with pytest.raises(ValueError, match="no records"):
        PromptStream(0, seed=0)


def test_warmup_then_constant_or_cosine() -> None:
    constant = lr_multiplier("constant", warmup_steps=4, total_steps=10)
    assert [constant(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = lr_multiplier("cosine", warmup_steps=2, total_steps=10)
    assert cosine(1) == 1.0 and cosine(2) == 1.0
    assert cosine(6) == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert cosine(9) < 0.05
