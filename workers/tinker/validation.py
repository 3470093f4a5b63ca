"""Checks of a request against the loss and the base model, before any tensor is built.

Each failure is a `TinkerInputError` naming the field (`data[2].loss_fn_inputs.weights`), so
the service answers a 4xx the SDK shows, and a bad request never reaches the model. No torch:
the API runs the same checks before it queues a request (service/tinker/futures.py), with the
catalog's vocabulary and context for `ModelLimits`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.losses.registry import KNOWN_INPUTS, REFUSED, SPECS, LossSpec
from workers.tinker.types import (
    MAX_LORA_RANK,
    MAX_SAMPLES,
    AdamParams,
    Datum,
    LoraConfig,
    SamplingParams,
    TinkerInputError,
)


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int  # token ids are in [0, vocab_size)
    context: int  # the longest sequence the model takes (max_position_embeddings)


def check_tokens(field: str, tokens: Sequence[object], limits: ModelLimits) -> list[int]:
    """`tokens` as token ids, once each is an integer inside the vocabulary."""
    ids: list[int] = []
    for j, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < limits.vocab_size:
            raise TinkerInputError(
                f"{field}[{j}]",
                f"token id {t!r} is outside the vocabulary 0..{limits.vocab_size - 1}",
            )
        ids.append(t)
    return ids


def check_loss(loss_fn: str, config: dict[str, Any] | None) -> tuple[LossSpec, dict[str, float]]:
    """The loss and its config (defaults filled in)."""
    if loss_fn in REFUSED:
        raise TinkerInputError("loss_fn", f"{loss_fn!r}: {REFUSED[loss_fn]}")
    if loss_fn not in SPECS:
        raise TinkerInputError("loss_fn", f"unknown loss {loss_fn!r}; one of {sorted(SPECS)}")
    spec = SPECS[loss_fn]
    merged = dict(spec.config)
    for key, value in (config or {}).items():
        if key not in spec.config:
            known = sorted(spec.config) or "none"
            raise TinkerInputError(f"loss_fn_config.{key}", f"{loss_fn} takes no {key!r} ({known})")
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise TinkerInputError(f"loss_fn_config.{key}", f"not a finite number: {value!r}")
        merged[key] = float(value)
    return spec, merged


def check_data(data: list[Datum], spec: LossSpec, limits: ModelLimits) -> None:
    if not data:
        raise TinkerInputError("data", "at least one datum is needed")
    for i, datum in enumerate(data):
        where, n = f"data[{i}]", len(datum.tokens)
        if n == 0:
            raise TinkerInputError(f"{where}.model_input", "no tokens")
        if n > limits.context:
            raise TinkerInputError(
                f"{where}.model_input", f"{n} tokens, over the context ({limits.context})"
            )
        check_tokens(f"{where}.model_input.tokens", datum.tokens, limits)
        inputs = datum.loss_fn_inputs
        for key in spec.required:
            if key not in inputs:
                raise TinkerInputError(f"{where}.loss_fn_inputs.{key}", f"{spec.name} needs it")
        for key, values in inputs.items():
            field = f"{where}.loss_fn_inputs.{key}"
            if key not in KNOWN_INPUTS:
                raise TinkerInputError(field, f"unknown input; known: {sorted(KNOWN_INPUTS)}")
            if len(values) != n:
                raise TinkerInputError(field, f"has {len(values)} values for {n} input tokens")
            if key == "target_tokens":
                check_tokens(field, values, limits)
            elif not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
                raise TinkerInputError(field, "every value must be a finite number")


def check_adam(adam: AdamParams) -> None:
    """Values torch's AdamW would take and silently turn into NaN weights."""
    bounds = {"learning_rate": (0, math.inf), "beta1": (0, 1), "beta2": (0, 1),
              "eps": (0, math.inf), "weight_decay": (0, math.inf),
              "grad_clip_norm": (0, math.inf)}  # fmt: skip
    for name, (low, high) in bounds.items():
        value = getattr(adam, name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not low <= value < high:
            raise TinkerInputError(f"adam_params.{name}", f"{value!r} is outside [{low}, {high})")


def check_lora(config: LoraConfig, linear_names: set[str]) -> None:
    """`linear_names`: the last name of every linear layer of the base model (`q_proj`...)."""
    if isinstance(config.rank, bool) or not isinstance(config.rank, int):
        raise TinkerInputError("lora_config.rank", "must be an integer")
    if not 1 <= config.rank <= MAX_LORA_RANK:
        raise TinkerInputError("lora_config.rank", f"{config.rank} is outside 1..{MAX_LORA_RANK}")
    if config.target_modules is not None:
        if not config.target_modules:
            raise TinkerInputError("lora_config.target_modules", "empty")
        for j, name in enumerate(config.target_modules):
            if name not in linear_names:
                raise TinkerInputError(
                    f"lora_config.target_modules[{j}]",
                    f"no linear layer {name!r}; the model has {sorted(linear_names)}",
                )
    elif not (config.train_attn or config.train_mlp or config.train_unembed):
        raise TinkerInputError("lora_config", "train_attn, train_mlp and train_unembed all off")


def stop_rule(
    stop: str | list[str] | list[int] | None, eos: int | None, limits: ModelLimits
) -> tuple[set[int], list[str]]:
    """The token ids and the strings that end a sequence (`SamplingParams.stop`)."""
    if stop is None:
        return ({eos} if eos is not None else set()), []
    items: list[str] | list[int] = [stop] if isinstance(stop, str) else stop
    strings = [s for s in items if isinstance(s, str)]
    if len(strings) == len(items):
        if any(s == "" for s in strings):
            raise TinkerInputError("sampling_params.stop", "an empty stop string")
        return ({eos} if eos is not None and strings else set()), strings
    return set(check_tokens("sampling_params.stop", items, limits)), []


def check_sample(
    prompt: list[int], num_samples: int, params: SamplingParams, limits: ModelLimits
) -> int:
    """The number of tokens to draw at most."""
    if not prompt:
        raise TinkerInputError("prompt", "no tokens")
    check_tokens("prompt.tokens", prompt, limits)
    if isinstance(num_samples, bool) or not 1 <= num_samples <= MAX_SAMPLES:
        raise TinkerInputError("num_samples", f"{num_samples!r} is outside 1..{MAX_SAMPLES}")
    room = limits.context - len(prompt)
    if room < 1:
        raise TinkerInputError("prompt", f"{len(prompt)} tokens leave no room in {limits.context}")
    p = params
    if p.max_tokens is not None and not 1 <= p.max_tokens <= room:
        raise TinkerInputError(
            "sampling_params.max_tokens", f"{p.max_tokens} is outside 1..{room} (context left)"
        )
    if not (math.isfinite(p.temperature) and p.temperature >= 0):
        raise TinkerInputError("sampling_params.temperature", "must be >= 0")
    if not 0 < p.top_p <= 1:
        raise TinkerInputError("sampling_params.top_p", "must be in (0, 1]")
    if p.top_k == 0 or p.top_k < -1:
        raise TinkerInputError("sampling_params.top_k", "must be -1 (no limit) or >= 1")
    return p.max_tokens if p.max_tokens is not None else room
