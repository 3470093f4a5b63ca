"""Learning-rate schedule: linear warm-up, then constant or cosine decay to zero at the end."""

from __future__ import annotations

import math
from collections.abc import Callable

_AFTER_WARMUP: dict[str, Callable[[float], float]] = {
    "constant": lambda progress: 1.0,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def lr_multiplier(kind: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """f(i): factor of the peak learning rate for the update of step i + 1 (for `LambdaLR`)."""
    after = _AFTER_WARMUP[kind]

    def factor(i: int) -> float:
        if i < warmup_steps:
            return (i + 1) / warmup_steps
        return after((i - warmup_steps) / max(1, total_steps - warmup_steps))

    return factor
