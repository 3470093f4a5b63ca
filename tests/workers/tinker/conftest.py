"""Fixtures of the Tinker engine tests: hosts on the session's tiny model, toy data on it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The hosts' device: cpu here; a GPU machine runs the same tests with TINKER_TEST_DEVICE=cuda.
DEVICE = os.environ.get("TINKER_TEST_DEVICE", "cpu")


@pytest.fixture
def make_host(tiny_model_dir: Path, tmp_path: Path) -> Callable:
    """A fresh LoraHost on the tiny model (its own state_dir each time, on DEVICE)."""
    from workers.tinker.host import LoraHost

    count = 0

    def make(**kwargs):  # noqa: ANN202
        nonlocal count
        count += 1
        kwargs.setdefault("state_dir", tmp_path / f"state{count}")
        kwargs.setdefault("device", DEVICE)
        return LoraHost(tiny_model_dir, **kwargs)

    return make


def sft_datum(tokenizer, text: str, prompt_chars: int = 3):  # noqa: ANN001, ANN201
    """Next-token data of `text`: weights 0 on the first `prompt_chars` targets."""
    from workers.tinker.types import Datum

    ids = tokenizer(text)["input_ids"]
    tokens, targets = ids[:-1], ids[1:]
    weights = [0.0 if i < prompt_chars else 1.0 for i in range(len(targets))]
    return Datum(tokens, {"target_tokens": targets, "weights": weights})


def rl_datum(tokenizer, text: str, advantage: float, shift: float = 0.1):  # noqa: ANN001, ANN201
    """Policy-gradient data of `text`: sampler log-probs -2 - shift * t, one advantage."""
    from workers.tinker.types import Datum

    ids = tokenizer(text)["input_ids"]
    tokens, targets = ids[:-1], ids[1:]
    n = len(targets)
    return Datum(
        tokens,
        {
            "target_tokens": targets,
            "logprobs": [-2.0 - shift * t for t in range(n)],
            "advantages": [advantage] * n,
        },
    )
