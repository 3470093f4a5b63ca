"""Evaluating a model on a dataset (the service's `POST /v1/evaluations`): k completions per
record sampled with the given generation settings, each scored by the verifiers exactly as a
training step scores its group (`score_batch`: r_i = sum_k w_k * score_k, an error scores 0 and
is kept), one row per completion as the rollouts hook writes them (`rollout_rows`).

The weights load as a job's would (`load_policy`: a catalog model, a checkpoint or an adapter
chain on it), with no optimizer, no reference copy and no gradients. The records go through in
batches of whole groups, so the caller can store and meter each batch and stop between them.
Sampling is seeded per run: the same model, records and seed give the same completions.

Left out: environments (multi-turn episodes), and the KL, advantages and loss of a step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workers.grpo.backend import select_backend
from workers.grpo.config import Engine, GenerationParams, TrainSpec
from workers.grpo.device import default_device, resolve_precision
from workers.grpo.policy import BaseWeights, load_policy
from workers.grpo.rollout_rows import rollout_rows
from workers.grpo.scoring import Scorer, score_batch

MAX_BATCH_COMPLETIONS = 64  # completions sampled at once: records per batch = this // k


@dataclass
class EvalBatch:
    """One batch's rows (one per completion, record by record) and the tokens it sampled."""

    rows: list[dict[str, Any]]
    completion_tokens: int


def _noop(*_: Any) -> None:
    return None


def evaluate_model(
    weights: BaseWeights,
    records: list[dict],
    scorers: Sequence[Scorer],
    samples_per_prompt: int,
    gen: GenerationParams,
    seed: int = 0,
    on_event: Callable[[str, str, dict], None] = _noop,
    device: str | None = None,
    engine: Engine | None = None,
) -> Iterator[EvalBatch]:
    """Batches of scored completions, `samples_per_prompt` per record, in record order, decoded
    by `engine` (`backend.select_backend`; None: the worker's `GRPO_ENGINE`, else auto)."""
    device = device or default_device()
    torch.manual_seed(seed)
    # load_policy reads the base, LoRA (none: the weights as they are) and beta (0: no copy).
    grpo = {"beta": 0.0, "engine": engine}
    spec = TrainSpec(base_model=weights.name or weights.path, grpo=grpo)
    precision = resolve_precision(spec.precision, device)
    policy = load_policy(spec, device, None, weights, precision)
    policy.model.requires_grad_(False)
    backend = select_backend(policy.model, spec.grpo, record=False)
    backend.prepare(policy.model)
    generator = torch.Generator(device=device).manual_seed(seed)
    sampler = backend.sampler(policy.model, policy.tokenizer, generator)
    per_batch = max(1, MAX_BATCH_COMPLETIONS // samples_per_prompt)
    for start in range(0, len(records), per_batch):
        batch = records[start : start + per_batch]
        with torch.no_grad():
            out = sampler.generate([r["prompt"] for r in batch], samples_per_prompt, gen)
        scored = score_batch(scorers, batch, out.texts, samples_per_prompt, on_event)  # (N,)
        ids = list(range(start, start + len(batch)))
        rows = rollout_rows(
            0, "eval", policy.tokenizer, batch, ids, out, scored.rewards, scored.scores,
            scored.errors, None,
        )  # fmt: skip
        yield EvalBatch(rows, sum(r["length"] for r in rows))
