"""The toy task the demo and the end-to-end tests train on: write the digit the prompt names.

A random-init tiny model can learn it in a few dozen CPU steps, so a reward curve that rises is
real evidence that the whole path (sampling, scoring, advantages, loss, update) works.
"""

from __future__ import annotations

import random
from typing import Any

# reward = share of completion characters equal to the named digit; other digits earn 0.3.
DIGIT_VERIFIER_SOURCE = """
def verify(prompt, completion, digit, **fields):
    if not completion:
        return 0.0
    target = str(digit)
    points = sum(1.0 if c == target else (0.3 if c.isdigit() else 0.0) for c in completion)
    return points / len(completion)
"""


def digit_records(n: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        digit = rng.randrange(10)
        records.append({"prompt": f"Digit {digit}:", "digit": digit})
    return records
