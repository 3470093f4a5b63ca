"""Shared pieces of the trainer tests: a small spec, a hooks recorder, fixed-score verifiers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from workers.grpo.config import TrainSpec
from workers.grpo.trainer import TrainHooks

SMALL_LM = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
)
LLAMA_FAMILY = ("llama", "qwen2", "qwen3")


def small_lm(name: str, **config: Any) -> Any:
    """A small random model of the lean forward's families: Llama (MHA), Qwen2 (GQA, q/k/v
    biases), Qwen3 (GQA, per-head q/k norms); `config` overrides `SMALL_LM`."""
    c = SMALL_LM | config
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(**c, num_key_value_heads=4))
    if name == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**c, num_key_value_heads=2))
    return Qwen3ForCausalLM(Qwen3Config(**c, num_key_value_heads=2, head_dim=16))


def small_spec(
    model: Path,
    *,
    max_new_tokens: int = 4,
    generation: dict | None = None,
    spec: dict | None = None,
    **grpo,
) -> TrainSpec:
    """A cheap run: 1 step of 2 prompts x 4 completions of 4 tokens unless overridden."""
    grpo = {"steps": 1, "prompts_per_step": 2, "group_size": 4, "learning_rate": 3e-3} | grpo
    return TrainSpec.model_validate(
        {
            "base_model": str(model),
            "grpo": grpo,
            "generation": {"max_new_tokens": max_new_tokens} | (generation or {}),
            "checkpoint_every": 1000,
        }
        | (spec or {})
    )


class Recorder(TrainHooks):
    """Keeps every step's metrics, checkpoint and event."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.checkpoints: list[tuple[int, Path]] = []
        self.events: list[tuple[str, str, dict]] = []
        super().__init__(
            on_step=lambda step, m: self.metrics.__setitem__(step, m),
            on_checkpoint=lambda step, path: self.checkpoints.append((step, path)),
            on_event=lambda *event: self.events.append(event),
        )


class FixedScorer:
    """Scores sample i of every call with values[i % len(values)]; keeps what it saw."""

    weight = 1.0

    def __init__(self, values: list[float], name: str = "fixed") -> None:
        self.values, self.name = values, name
        self.seen: list[list[dict]] = []

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        self.seen.append(samples)
        scores = [self.values[i % len(self.values)] for i in range(len(samples))]
        return scores, [None] * len(samples)


class DriftScorer:
    """Every sample of call c scores start + c * delta: rewards that drift by construction."""

    weight = 1.0

    def __init__(self, name: str, start: float, delta: float) -> None:
        self.name, self.start, self.delta, self.calls = name, start, delta, 0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        value = self.start + self.calls * self.delta
        self.calls += 1
        return [value] * len(samples), [None] * len(samples)
