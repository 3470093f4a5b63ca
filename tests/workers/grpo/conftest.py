"""Fixtures of the GRPO engine tests: a tiny local model (built once), a toy digit task."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here must work without a model hub


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~3M-parameter random-init Llama with a character-level tokenizer."""
    from workers.grpo.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("grpo-models") / "tiny", seed=0)


class DigitScorer:
    """Share of completion characters equal to the record's digit; other digits earn 0.3."""

    name = "digit"
    weight = 1.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        scores: list[float | None] = []
        for s in samples:
            text, digit = s["completion"], str(s["digit"])
            per_char = [1.0 if c == digit else 0.3 if c.isdigit() else 0.0 for c in text]
            scores.append(sum(per_char) / len(per_char) if per_char else 0.0)
        return scores, [None] * len(samples)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model: Path):
    """The tiny model with EOS made likely (~11% a token): sequences end at different steps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 2.5
    model.lm_head.register_forward_hook(lambda _m, _i, out: out + bias)
    return model, tokenizer


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory):
    """A small random-init model with a chat template (episodes), and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.grpo.tiny_model import make_tiny_model

    path = make_tiny_model(
        tmp_path_factory.mktemp("chat") / "tiny", hidden_size=64, layers=2,
        intermediate_size=128, chat_template=True,
    )  # fmt: skip
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture
def digit_records() -> list[dict]:
    return [{"prompt": f"Digit {d}:", "digit": d} for d in (3, 7)]


@pytest.fixture
def digit_scorer() -> DigitScorer:
    return DigitScorer()
