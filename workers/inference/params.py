"""What one generation request asks for and what it gets back (plain data, no torch)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class ModelRef:
    """Where a model's weights lie on this machine, as the serving process resolved them.

    `weights` is a full `save_pretrained` directory; `merged` adapters are folded into it
    (oldest first) when it loads; `adapter` is a peft adapter served on top of that base and
    swapped per batch, never merged, so bases are shared between adapters."""

    weights: str
    merged: tuple[str, ...] = ()
    adapter: str | None = None
    label: str = ""  # what errors and stats call it (the model id the client named)

    @property
    def base_key(self) -> tuple[str, tuple[str, ...]]:
        return self.weights, self.merged


@dataclass(frozen=True)
class Sampling:
    """Sampling of one request's choices. temperature 0 is greedy decoding."""

    max_tokens: int | None = None  # None: up to the model's context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    stop: tuple[str, ...] = ()
    seed: int | None = None  # the request's own noise: same seed, same completions
    logprobs: int | None = None  # None: none; k >= 0: each token's log-prob and the top k


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Choice:
    index: int
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS or a stop string) | "length"
    logprobs: list[TokenLogprob] = field(default_factory=list)
    completion_tokens: int = 0


@dataclass
class Result:
    prompt_tokens: int
    choices: list[Choice]

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)


class RequestError(ValueError):
    """The request cannot be served as asked (prompt too long for the model...): a 400."""


class Cancelled(RuntimeError):
    """The request was cancelled (its client went away) before it was decoded to its end."""


@dataclass
class Request:
    """One request of `n` choices. The engine thread calls `on_delta` as text is produced
    (streaming), then exactly one of `on_done` and `on_error`. `cancel()` (from any thread)
    drops its rows from the decode at the next token; it then ends with `Cancelled`."""

    model: ModelRef
    prompt: Prompt
    sampling: Sampling
    n: int = 1
    on_delta: Callable[[int, str, list[TokenLogprob]], None] | None = None
    on_done: Callable[[Result], None] = lambda _: None
    on_error: Callable[[BaseException], None] = lambda _: None
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()
