"""The GRPO training loop (Shao et al., 2024, Algorithm 1, outcome supervision).

Each step: take prompts -> sample G completions per prompt -> score with every verifier
(r = sum_k w_k * score_k) -> group-relative advantages -> reference log-probs (beta > 0) ->
for mu = num_iterations passes: clipped-surrogate + k3-KL loss over micro-batches with gradient
accumulation, grad-norm clip, AdamW step -> lr schedule -> metrics -> checkpoint.
Left out here: held-out evaluation (`eval_every`), reward-model updates (the paper's iterative
RL), multi-GPU. Same spec and seed on CPU give the same metrics step for step, also across a
resume from a checkpoint.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from workers.grpo.advantages import group_advantages, zero_std_group_fraction
from workers.grpo.checkpoint import load_trainer_state, rng_state, save_checkpoint, set_rng_state
from workers.grpo.config import TrainSpec
from workers.grpo.data import PromptStream
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.loss import grpo_loss, loss_denominator
from workers.grpo.policy import ModelLoadError, Policy, load_policy
from workers.grpo.sampling import Generation, HFSampler, Sampler
from workers.grpo.schedule import lr_multiplier
from workers.grpo.scoring import Scorer, score_completions

__all__ = ["ModelLoadError", "Scorer", "TrainHooks", "TrainResult", "train"]


def _noop(*_: Any) -> None:
    return None


@dataclass
class TrainHooks:
    on_step: Callable[[int, dict[str, float]], None] = _noop  # (step, metrics), step 1-based
    on_checkpoint: Callable[[int, Path], None] = _noop  # (step, checkpoint directory)
    should_stop: Callable[[], bool] = lambda: False  # checked at every step boundary
    on_event: Callable[[str, str, dict], None] = _noop  # (type, message, data)


@dataclass
class TrainResult:
    steps_completed: int
    stopped: bool
    final_checkpoint: Path | None


@dataclass
class Run:
    """Everything a step reads or updates."""

    spec: TrainSpec
    policy: Policy
    sampler: Sampler
    generator: torch.Generator
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    stream: PromptStream
    records: list[dict]
    scorers: list[Scorer]
    hooks: TrainHooks
    step: int = 0
    params: list[torch.nn.Parameter] = field(default_factory=list)


def train(
    spec: TrainSpec,
    records: list[dict],
    scorers: list[Scorer],
    work_dir: Path,
    hooks: TrainHooks,
    *,
    resume_from: Path | None = None,
    device: str | None = None,
) -> TrainResult:
    """Run `spec.grpo.steps` GRPO steps (from the checkpoint's step + 1 when resuming)."""
    run = _setup(spec, records, scorers, hooks, resume_from, device)
    last = resume_from
    for step in range(run.step + 1, spec.grpo.steps + 1):
        if hooks.should_stop():
            return TrainResult(run.step, True, last)
        metrics = grpo_step(run)
        run.step = step
        hooks.on_step(step, metrics)
        if step % spec.checkpoint_every == 0 or step == spec.grpo.steps:
            last = _save(run, Path(work_dir) / "checkpoints" / f"step-{step:06d}")
            hooks.on_checkpoint(step, last)
    return TrainResult(run.step, False, last)


def grpo_step(run: Run) -> dict[str, float]:
    """One GRPO step; returns its metrics."""
    g, gen, model = run.spec.grpo, run.spec.generation, run.policy.model
    t_start = time.perf_counter()
    # 1. prompts
    batch = [run.records[i] for i in run.stream.take(g.prompts_per_step)]
    # 2. G completions per prompt from the current policy
    model.eval()
    out = run.sampler.generate([r["prompt"] for r in batch], g.group_size, gen)
    t_generated = time.perf_counter()
    # 3. rewards from every verifier
    rewards, metrics = score_completions(
        run.scorers, batch, out.texts, g.group_size, run.hooks.on_event
    )  # (N,)
    t_scored = time.perf_counter()
    # 4. group-relative advantages
    advantages = group_advantages(rewards, g.group_size, g.std).to(model.device)  # (N,)
    # 5. pi_ref (KL) and, when the batch is reused mu times, pi_old
    ref, ref_context = run.policy.reference, run.policy.reference_context
    ref_lp = no_grad_logprobs(run, ref, out, ref_context) if g.beta > 0 else None  # (N, T)
    old_lp = no_grad_logprobs(run, model, out) if g.num_iterations > 1 else None  # (N, T)
    # 6. mu optimisation passes over the batch, in micro-batches
    model.train()
    denominator = loss_denominator(out.completion_mask, g.loss_aggregation, gen.max_new_tokens)
    passes = []
    learning_rate = run.optimizer.param_groups[0]["lr"]
    for i in range(g.num_iterations):
        stats = accumulate_gradients(run, out, advantages, old_lp, ref_lp, denominator, i == 0)
        grad_norm = torch.nn.utils.clip_grad_norm_(run.params, g.max_grad_norm)
        stats["grad_norm"] = grad_norm.item()
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        passes.append(stats)
    run.scheduler.step()
    t_end = time.perf_counter()
    # 7. metrics
    lengths = out.completion_mask.sum(1)  # (N,)
    step_seconds = t_end - t_start
    metrics |= {k: sum(p[k] for p in passes) / len(passes) for k in passes[0] if k != "entropy"}
    metrics |= {
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std(unbiased=False).item(),
        "frac_zero_std_groups": zero_std_group_fraction(rewards, g.group_size),
        "advantage_abs_mean": advantages.abs().mean().item(),
        "entropy": passes[0]["entropy"],
        "completion_len_mean": lengths.mean().item(),
        "truncated_frac": out.truncated.float().mean().item(),
        "learning_rate": learning_rate,
        "step_seconds": step_seconds,
        "tokens_per_second": lengths.sum().item() / step_seconds,
        "generation_seconds": t_generated - t_start,
        "scoring_seconds": t_scored - t_generated,
        "training_seconds": t_end - t_scored,
    }
    return metrics


def _slices(run: Run, n: int) -> list[slice]:
    size = run.spec.grpo.micro_batch_size or n
    return [slice(i, i + size) for i in range(0, n, size)]


@torch.no_grad()
def no_grad_logprobs(
    run: Run,
    model: Any,
    out: Generation,
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Tensor:
    """Log-probs (N, T) of the completions under `model` (pi_ref or pi_old), by micro-batch."""
    temperature = run.spec.generation.temperature
    chunks = []
    with context():
        for s in _slices(run, out.completion_ids.shape[0]):
            lp, _ = completion_logprobs(
                model,
                out.prompt_ids[s],
                out.prompt_mask[s],
                out.completion_ids[s],
                out.completion_mask[s],
                temperature,
            )
            chunks.append(lp)  # (n, T)
    return torch.cat(chunks)  # (N, T)


def accumulate_gradients(
    run: Run,
    out: Generation,
    advantages: Tensor,
    old_lp: Tensor | None,
    ref_lp: Tensor | None,
    denominator: float,
    with_entropy: bool,
) -> dict[str, float]:
    """Backward the loss micro-batch by micro-batch; the summed gradient is the full batch's."""
    g, mask = run.spec.grpo, out.completion_mask  # (N, T)
    total_tokens = max(mask.sum().item(), 1.0)
    stats: dict[str, float] = {}
    for s in _slices(run, mask.shape[0]):
        lp, entropy = completion_logprobs(
            run.policy.model,
            out.prompt_ids[s],
            out.prompt_mask[s],
            out.completion_ids[s],
            mask[s],
            run.spec.generation.temperature,
            with_entropy,
        )
        loss, mb = grpo_loss(
            lp,
            None if old_lp is None else old_lp[s],
            None if ref_lp is None else ref_lp[s],
            advantages[s],
            mask[s],
            clip_epsilon=g.clip_epsilon,
            clip_epsilon_high=g.clip_high,
            beta=g.beta,
            aggregation=g.loss_aggregation,
            max_new_tokens=run.spec.generation.max_new_tokens,
            denominator=denominator,
        )
        loss.backward()
        share = mask[s].sum().item() / total_tokens  # token-weighted means over micro-batches
        if entropy is not None:
            mb["entropy"] = (entropy * mask[s]).sum().item() / mask[s].sum().clamp(min=1).item()
        for k, v in mb.items():
            stats[k] = stats.get(k, 0.0) + (v if k in ("loss", "policy_loss") else v * share)
    return stats


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _setup(
    spec: TrainSpec,
    records: list[dict],
    scorers: list[Scorer],
    hooks: TrainHooks,
    resume_from: Path | None,
    device: str | None,
) -> Run:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    g = spec.grpo
    _seed_everything(g.seed)
    policy = load_policy(spec, device, resume_from)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=g.learning_rate, weight_decay=g.weight_decay)
    factor = lr_multiplier(g.lr_schedule, g.warmup_steps, g.steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    generator = torch.Generator(device=device).manual_seed(g.seed)
    sampler = HFSampler(policy.model, policy.tokenizer, generator)
    stream = PromptStream(len(records), g.seed)
    run = Run(
        spec,
        policy,
        sampler,
        generator,
        optimizer,
        scheduler,
        stream,
        records,
        scorers,
        hooks,
        params=params,
    )
    if resume_from is not None:
        state = load_trainer_state(Path(resume_from))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["data"])
        set_rng_state(state["rng"], generator)
        run.step = state["step"]
    return run


def _save(run: Run, directory: Path) -> Path:
    state = {
        "step": run.step,
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "data": run.stream.state_dict(),
        "rng": rng_state(run.generator),
    }
    return save_checkpoint(directory, run.policy.model, run.policy.tokenizer, run.spec, state)
