"""Pre-flight: one real GRPO step of a job's spec on a few prompts, before the job spends hours.

GRPO's advantage A_i = (r_i - mean(r)) / (std(r) + eps) is zero for every completion of a group
whose G rewards are all equal: such a group adds no gradient (Shao et al., 2024; DAPO's
dynamic sampling exists for this). So a reward that gives every completion of a prompt the same
score, a verifier that errors, or completions cut at `max_new_tokens` waste a run from its first
step, and a few groups sampled from the base model show it.

The step is the training's own: the same `Run` as `train()` builds (model or checkpoint, LoRA,
sampler, backend, the job's seed, so the same first prompts), then `grpo_step` (sample G
completions per prompt with the job's generation settings -> score with the job's verifiers ->
advantages -> loss -> backward -> AdamW step), on `prompts` prompts instead of
`prompts_per_step`. Its time, scaled linearly to `prompts_per_step`, is the per-step estimate.

Left out: DAPO's refill (the figures are the first draw's, as the training metrics are), the KL
reference pass (skipped by any run's first step: the policy still is the reference), evaluation,
checkpoints. The step also carries first-step costs (kernel warm-up, allocator growth).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from workers.grpo.config import TrainSpec
from workers.grpo.policy import BaseWeights
from workers.grpo.run import TrainHooks, open_run
from workers.grpo.scoring import Scorer
from workers.grpo.trainer import grpo_step

MAX_ERROR_RATE = 0.05  # verifier errors above this share of scores: fatal
MOST = 0.5  # "most groups" / "most completions"
MAX_SAMPLES = 64  # completions returned, whole groups first
MAX_TEXT = 2000  # characters kept of each sample's prompt and completion


@dataclass(frozen=True)
class PreflightWarning:
    code: str
    message: str
    fatal: bool  # a job with `preflight: "require"` refuses itself on it


@dataclass
class PreflightReport:
    reward_mean: float
    reward_std: float
    zero_std_fraction: float  # groups whose G rewards are all equal
    verifier_error_rate: float  # failed scores / (completions x verifiers)
    truncated_fraction: float  # completions cut at max_new_tokens
    completion_len_mean: float  # tokens
    seconds_per_step_estimate: float  # step_seconds x prompts_per_step / prompts
    step_seconds: float  # the measured step, at `prompts` prompts
    prompts: int
    group_size: int
    peak_memory_bytes: int  # measured during the step (its batch is `prompts` x G)
    reward_by_verifier: dict[str, float]
    warnings: list[PreflightWarning] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def preflight_warnings(
    zero_std_fraction: float, verifier_error_rate: float, truncated_fraction: float
) -> list[PreflightWarning]:
    """What the figures mean for a run; `fatal` ones make it pointless."""
    out = []
    if zero_std_fraction >= 1.0:
        out.append(PreflightWarning(
            "all_groups_zero_spread",
            "all groups score the same; GRPO learns nothing from them",
            fatal=True,
        ))  # fmt: skip
    elif zero_std_fraction > MOST:
        out.append(PreflightWarning(
            "most_groups_zero_spread",
            f"{zero_std_fraction:.0%} of groups score the same (no learning signal in them); "
            "consider a finer-grained reward, a larger group_size or skip_zero_std_groups",
            fatal=False,
        ))  # fmt: skip
    if verifier_error_rate > MAX_ERROR_RATE:
        out.append(PreflightWarning(
            "verifier_errors",
            f"verifiers failed on {verifier_error_rate:.0%} of scores (over "
            f"{MAX_ERROR_RATE:.0%}); a failed score counts as 0",
            fatal=True,
        ))  # fmt: skip
    if truncated_fraction > MOST:
        out.append(PreflightWarning(
            "most_truncated",
            f"{truncated_fraction:.0%} of completions were cut at max_new_tokens; raise it or "
            "add stop strings",
            fatal=False,
        ))  # fmt: skip
    return out


def preflight(
    spec: TrainSpec,
    records: list[dict],
    scorers: Sequence[Scorer],
    *,
    weights: BaseWeights | None = None,
    prompts: int = 4,
    device: str | None = None,
) -> PreflightReport:
    """One GRPO step of `spec` on `prompts` prompts (the job's first ones), and what it shows."""
    g = spec.grpo
    n = prompts * g.group_size
    # The job's micro-batch must divide this smaller batch too: the largest one that does.
    micro = math.gcd(n, g.micro_batch_size) if g.micro_batch_size else None
    small = spec.model_copy(update={"grpo": g.model_copy(update={
        "prompts_per_step": prompts, "skip_zero_std_groups": False, "micro_batch_size": micro,
    })})  # fmt: skip
    rows: list[dict[str, Any]] = []
    hooks = TrainHooks(on_rollouts=lambda _step, _split, batch: rows.extend(batch))
    run = open_run(small, records, scorers, hooks, None, device, weights)
    try:
        metrics = grpo_step(run)
        peak = run.meter.peak() if run.meter is not None else 0
        cuda = run.policy.model.device.type == "cuda"
    finally:
        del run  # the model and optimizer go before a job loads its own (`require`)
        gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    failed = sum(len(r["errors"]) for r in rows)
    error_rate = failed / max(1, len(rows) * len(scorers))
    zero_std, truncated = metrics["frac_zero_std_groups"], metrics["truncated_frac"]
    return PreflightReport(
        reward_mean=metrics["reward_mean"],
        reward_std=metrics["reward_std"],
        zero_std_fraction=zero_std,
        verifier_error_rate=error_rate,
        truncated_fraction=truncated,
        completion_len_mean=metrics["completion_len_mean"],
        seconds_per_step_estimate=metrics["step_seconds"] * g.prompts_per_step / prompts,
        step_seconds=metrics["step_seconds"],
        prompts=prompts,
        group_size=g.group_size,
        peak_memory_bytes=int(peak),
        reward_by_verifier={
            k.removeprefix("reward/"): v for k, v in metrics.items() if k.startswith("reward/")
        },
        warnings=preflight_warnings(zero_std, error_rate, truncated),
        samples=_samples(rows, g.group_size),
    )


def _samples(rows: list[dict[str, Any]], group_size: int) -> list[dict[str, Any]]:
    """Whole groups first (so a group's spread can be seen), at most MAX_SAMPLES completions."""
    keep = max(1, MAX_SAMPLES // group_size) * group_size
    return [
        {
            "group": r["group"],
            "prompt": r["prompt"][:MAX_TEXT],
            "completion": r["completion"][:MAX_TEXT],
            "reward": r["reward"],
            "scores": r["scores"],
            "errors": r["errors"],
            "length": r["length"],
            "truncated": r["truncated"],
        }
        for r in rows[: min(keep, MAX_SAMPLES)]
    ]
