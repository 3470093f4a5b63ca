"""The toy tasks: the digit task the end-to-end tests train a random tiny model on (write the
digit the prompt names), and `make demo`'s two-digit addition for a real chat model.

A random-init tiny model learns the digit task in a few dozen CPU steps, so a reward curve that
rises is real evidence that the whole path (sampling, scoring, advantages, loss, update) works.
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


# ----------------------------------------------------------------------------- addition
# `make demo`'s task on a real chat model: two-digit sums asked as a chat turn, scored by the
# built-in `numeric` verifier (the completion's last number against the record's `answer`).
# Asked for the number only: asked the bare question, SmolLM2-135M explains the sum at length
# and its 24 tokens run out before the answer (bench/README.md, "The demo").
ADDITION_QUESTION = "What is {a} + {b}? Answer with the number only."


def _addition_record(a: int, b: int) -> dict[str, Any]:
    question = ADDITION_QUESTION.format(a=a, b=b)
    return {"prompt": [{"role": "user", "content": question}], "answer": a + b}


def addition_split(
    train: int, held_out: int, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`train` and `held_out` two-digit sums as chat records, no pair (a, b) in both: the
    held-out accuracy measures sums the model was never rewarded on."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    if train + held_out > len(pairs):
        raise ValueError(f"at most {len(pairs)} distinct two-digit sums")
    random.Random(seed).shuffle(pairs)
    records = [_addition_record(a, b) for a, b in pairs[: train + held_out]]
    return records[held_out:], records[:held_out]
