"""GRPO steps 1-3 (prompts -> G completions each -> rewards), with DAPO's dynamic sampling.

Plain GRPO draws `prompts_per_step` prompts, samples G completions per prompt and scores them.
A group whose G rewards are all equal has zero advantage everywhere and teaches nothing.
Dynamic sampling (DAPO, Yu et al., 2025, eq. 11: 0 < |{correct}| < G), on with
`skip_zero_std_groups`, draws as many new prompts as there are such groups, samples and scores
them, and puts every new group with a reward spread into a zero-spread slot; it repeats up to
`max_resample_rounds` times, then trains on what it has (left-over flat groups add no gradient).
DAPO over-samples a larger batch and filters it; refilling slot by slot keeps the batch shape.

Metrics: the reward statistics (`reward_mean`, `reward/<name>`, `frac_zero_std_groups`, ...)
describe the first draw only, an unbiased estimate of the policy's reward on the data; error
counts (`errors/<name>`) add up every draw; `resampled_groups` counts the extra prompts drawn;
`completion_tokens` counts every completion token sampled, refills included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from workers.grpo.config import GenerationParams, GRPOParams
from workers.grpo.sampling import Generation, Sampler
from workers.grpo.scoring import Scored, Scorer, score_batch

if TYPE_CHECKING:
    from workers.grpo.episode_rollout import EpisodeRollout


@dataclass
class Rollout:
    """The batch a step trains on: P prompts x G completions, group by group."""

    records: list[dict]  # P records, one per group
    generation: Generation  # N = P * G completions
    rewards: Tensor  # (N,) rewards of the trained batch
    first_rewards: Tensor  # (N,) rewards of the first draw (the metrics' rewards)
    metrics: dict[str, float]  # reward/<name>, errors/<name>, resampled_groups, timings
    scores: dict[str, list[float | None]] = field(default_factory=dict)  # name -> N scores
    errors: dict[str, list[str | None]] = field(default_factory=dict)  # name -> N errors
    transcripts: list[list[dict]] | None = None  # episodes: N transcripts
    turn_rewards: list[list[float]] | None = None  # episodes: N lists of step rewards


def flat_groups(rewards: Tensor, group_size: int) -> list[int]:
    """Indices of the groups whose rewards are all equal (zero std)."""
    groups = rewards.view(-1, group_size)  # (P, G)
    return (groups == groups[:, :1]).all(dim=1).nonzero().flatten().tolist()


def collect_rollout(
    draw: Callable[[int], list[dict]],
    sampler: Sampler,
    scorers: Sequence[Scorer],
    grpo: GRPOParams,
    gen: GenerationParams,
    pad_id: int,
    on_event: Callable[[str, str, dict], None],
    episodes: EpisodeRollout | None = None,
) -> Rollout:
    """Draw prompts, sample G completions each, score them; refill flat groups if asked.
    With `episodes`, each completion is an episode of that environment, scored as a whole."""
    # Timings, and every completion token sampled (refills too: usage counts what was made).
    timing = {"generation_seconds": 0.0, "scoring_seconds": 0.0, "completion_tokens": 0.0}
    G = grpo.group_size

    played: list = []  # episodes: each part's transcripts and turn rewards

    def sample(k: int) -> tuple[list[dict], Generation, Scored]:
        records = draw(k)
        t0 = time.perf_counter()
        keep = grpo.num_iterations > 1  # pi_old from the sampling pass
        if episodes is not None:  # the environment's steps run between the turns
            out, scored, part = episodes.play(records, sampler, scorers, G, gen, keep, on_event)
            played.append(part)
            timing["generation_seconds"] += time.perf_counter() - t0
            timing["completion_tokens"] += scored.metrics.pop("completion_tokens")
            return records, out, scored
        prompts = [r["prompt"] for r in records]
        out = sampler.generate(prompts, G, gen, keep_logprobs=keep)
        t1 = time.perf_counter()
        scored = score_batch(scorers, records, out.texts, G, on_event)  # rewards (k*G,)
        timing["generation_seconds"] += t1 - t0
        timing["completion_tokens"] += out.completion_mask.sum().item()
        timing["scoring_seconds"] += time.perf_counter() - t1
        return records, out, scored

    records, out, first = sample(grpo.prompts_per_step)
    rewards, metrics = first.rewards, first.metrics
    parts = [(out, first)]
    slots = [(0, i) for i in range(grpo.prompts_per_step)]  # slot -> (part, group in part)
    flat = flat_groups(rewards, G) if grpo.skip_zero_std_groups else []
    resampled = 0
    for _ in range(grpo.max_resample_rounds):
        if not flat:
            break
        more, out_k, scored_k = sample(len(flat))
        resampled += len(flat)
        for key, value in scored_k.metrics.items():
            if key.startswith("errors/"):
                metrics[key] += value
        parts.append((out_k, scored_k))
        spread = sorted(set(range(len(more))) - set(flat_groups(scored_k.rewards, G)))
        for slot, group in zip(list(flat), spread, strict=False):
            slots[slot], records[slot] = (len(parts) - 1, group), more[group]
            flat.remove(slot)
    rows = [(part, group * G + j) for part, group in slots for j in range(G)]
    generation = merge_generations([p for p, _ in parts], rows, pad_id)
    final = torch.stack([parts[part][1].rewards[row] for part, row in rows])  # (N,)
    scored = grpo.prompts_per_step + resampled  # groups scored, refills included
    metrics |= timing | {"resampled_groups": float(resampled), "scored_completions": scored * G}
    # Each trained completion's own scores and errors, for its rollout row.
    scores = {n: [parts[p][1].scores[n][r] for p, r in rows] for n in first.scores}
    errors = {n: [parts[p][1].errors[n][r] for p, r in rows] for n in first.errors}
    roll = Rollout(records, generation, final, rewards, metrics, scores, errors)
    if played:
        roll.transcripts = [played[p].transcripts[r] for p, r in rows]
        roll.turn_rewards = [played[p].turn_rewards[r] for p, r in rows]
    return roll


def merge_generations(
    parts: list[Generation], rows: list[tuple[int, int]], pad_id: int
) -> Generation:
    """The rows (part, row) of several generations as one, re-padded (prompts left, completions
    right) to the widest prompt and completion. The backends' states stay with their parts."""
    if len(parts) == 1 and [r for _, r in rows] == list(range(len(rows))):
        return parts[0]
    width_p = max(p.prompt_ids.shape[1] for p in parts)
    width_c = max(p.completion_ids.shape[1] for p in parts)

    def pad(t: Tensor, width: int, value: float, left: bool) -> Tensor:
        extra = width - t.shape[1]
        return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

    def column(field: str, width: int, value: float, left: bool) -> Tensor:
        rows_of = [pad(getattr(parts[p], field)[r : r + 1], width, value, left) for p, r in rows]
        return torch.cat(rows_of)  # (N, width)

    kept = all(p.logprobs is not None for p in parts)
    known = [p.lengths for p in parts if p.lengths is not None]  # every part's, or not all
    lengths = [known[p][r] for p, r in rows] if len(known) == len(parts) else None
    sizes = {p.group_size for p in parts}
    episodes = any(p.model_mask is not None for p in parts)
    return Generation(
        column("prompt_ids", width_p, pad_id, True),
        column("prompt_mask", width_p, 0, True),
        column("completion_ids", width_c, pad_id, False),
        column("completion_mask", width_c, 0.0, False),
        [parts[part].texts[row] for part, row in rows],
        torch.stack([parts[part].truncated[row] for part, row in rows]),
        column("logprobs", width_c, 0.0, False) if kept else None,
        lengths,
        sizes.pop() if len(sizes) == 1 else None,
        model_mask=column("sampled_mask", width_c, 0.0, False) if episodes else None,
    )
