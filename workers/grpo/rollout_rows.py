"""The rows of the rollouts hook (`TrainHooks.on_rollouts`): one per completion a step sampled.

Built from what the step already holds: the texts the sampler decoded once, the lengths it kept
on the host, the verifiers' scores and the advantages. No decode and no forward pass is added;
the one tokenizer call renders each prompt (a chat template) once per group, not per completion.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from workers.grpo.sampling import Generation
from workers.grpo.text import render_prompt

ROW_KEYS = (
    "step", "split", "group", "index", "record", "prompt", "messages", "completion", "reward",
    "scores", "advantage", "length", "truncated", "finish_reason", "errors",
)  # fmt: skip


def rollout_rows(
    step: int,
    split: str,
    tokenizer: Any,
    records: list[dict],
    record_ids: list[int],
    out: Generation,
    rewards: Tensor,
    scores: dict[str, list[float | None]],
    errors: dict[str, list[str | None]],
    advantages: Tensor | None,
    transcripts: list[list[dict]] | None = None,
    turn_rewards: list[list[float]] | None = None,
) -> list[dict[str, Any]]:
    """One row per completion, group by group: `records[g]` (dataset index `record_ids[g]`)
    prompted group g, whose G = len(out.texts) / len(records) completions are consecutive.

    Episodes (`transcripts`): `messages` is the row's whole transcript, `completion` its last
    assistant turn, `length` its sampled tokens, and `scores` holds each step's reward as
    `turn/<k>` next to the verifiers' scores."""
    group_size = len(out.texts) // len(records)
    if transcripts is not None:
        lengths = [int(n) for n in out.sampled_mask.sum(1).tolist()]
    elif out.lengths is not None:
        lengths = out.lengths
    else:
        lengths = out.completion_mask.sum(1).tolist()
    truncated = out.truncated.tolist()  # (N,) one transfer each, never per row
    reward_list = rewards.tolist()
    advantage_list = advantages.tolist() if advantages is not None else None
    rows: list[dict[str, Any]] = []
    for g, (record, record_id) in enumerate(zip(records, record_ids, strict=True)):
        prompt = record["prompt"]
        text, _ = render_prompt(tokenizer, prompt)
        messages = list(prompt) if isinstance(prompt, list) else None
        for j in range(group_size):
            i = g * group_size + j
            cut = bool(truncated[i])
            turns = {} if turn_rewards is None else _turn_scores(turn_rewards[i])
            rows.append({
                "step": step,
                "split": split,
                "group": g,
                "index": j,
                "record": record_id,
                "prompt": text,
                "messages": messages if transcripts is None else transcripts[i],
                "completion": out.texts[i],
                "reward": float(reward_list[i]),
                "scores": {name: values[i] for name, values in scores.items()} | turns,
                "advantage": None if advantage_list is None else float(advantage_list[i]),
                "length": int(lengths[i]),
                "truncated": cut,
                "finish_reason": "length" if cut else "stop",
                "errors": {name: e[i] for name, e in errors.items() if e[i] is not None},
            })  # fmt: skip
    return rows


def _turn_scores(rewards: list[float]) -> dict[str, float | None]:
    return {f"turn/{k + 1}": float(r) for k, r in enumerate(rewards)}
