"""Two-digit addition for a real chat model (`bench/real_model.py`): the records, the verifier
and a greedy held-out accuracy that both trainers' resulting weights are measured with.

A record is `{"prompt": [one user message], "answer": a + b}`; both trainers render the prompt
with the model's chat template. The verifier reads the last integer of the completion, so an
answer may come with words around it ("37 + 45 = 82"), as a chat model writes it.
"""

from __future__ import annotations

import re
from typing import Any

from service.demo_task import addition_split

INTEGER = re.compile(r"-?\d+")


def addition_sets(train: int, held_out: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training records and held-out records: `make demo`'s task and split
    (`service.demo_task.addition_split`: the same question, no sum in both sets), the same for
    every seed, so runs of different seeds see the same data."""
    return addition_split(train, held_out)


def last_integer(text: str) -> int | None:
    found = INTEGER.findall(text.replace(",", ""))  # "1,024" is one number
    return int(found[-1]) if found else None


def addition_reward(completion: str | list[dict[str, str]], answer: int) -> float:
    """1.0 when the completion's last integer is the sum, else 0.0. A completion may be
    chat messages (TRL's conversational format): the assistant's text is scored."""
    if not isinstance(completion, str):
        completion = "".join(m["content"] for m in completion)
    return 1.0 if last_integer(completion) == answer else 0.0


def greedy_accuracy(
    model: Any, tokenizer: Any, records: list[dict], max_new_tokens: int, batch: int = 50
) -> dict[str, Any]:
    """Share of `records` whose greedy completion the verifier accepts, and three samples.
    Prompts are rendered with the chat template and left-padded in batches of `batch`."""
    import torch

    texts = [
        tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in records
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    answers: list[str] = []
    try:
        for start in range(0, len(texts), batch):
            enc = tokenizer(
                texts[start : start + batch], return_tensors="pt", padding=True,
                add_special_tokens=False,
            )  # fmt: skip
            enc = {k: v.to(model.device) for k, v in enc.items()}
            with torch.no_grad():
                out = model.generate(
                    **enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad,
                    temperature=None, top_p=None, top_k=None,
                )  # fmt: skip
            width = enc["input_ids"].shape[1]
            answers += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    right = [addition_reward(t, r["answer"]) for t, r in zip(answers, records, strict=True)]
    samples = [{"prompt": r["prompt"][-1]["content"], "completion": t} for t, r in
               zip(answers[:3], records[:3], strict=True)]  # fmt: skip
    return {"accuracy": sum(right) / len(records), "samples": samples}
