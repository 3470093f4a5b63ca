"""Fixtures of the model loader tests: the tiny model, and a copy whose tokenizer has no pad."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def no_pad_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its tokenizer saved without a pad token (as GPT-2's and Llama's)."""
    from transformers import AutoTokenizer

    path = shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("nopad") / "m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(path)
    assert AutoTokenizer.from_pretrained(path).pad_token_id is None
    return path
