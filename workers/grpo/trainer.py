"""The GRPO training loop (Shao et al., 2024, Algorithm 1, outcome supervision).

Each step: take prompts -> sample G completions per prompt -> score with every verifier
(r = sum_k w_k * score_k; DAPO dynamic sampling refills zero-spread groups, `rollout.py`) ->
group-relative advantages -> reference log-probs (beta > 0; none computed at beta = 0) -> for
mu = num_iterations passes: clipped-surrogate + k3-KL loss over micro-batches with gradient
accumulation (`update.py`), grad-norm clip, AdamW step -> lr schedule -> metrics -> held-out
evaluation and the reward-hacking watch (`evaluation.py`) -> the flat-reward warning
(`flat_rewards.py`) -> checkpoint. With an environment, each completion is an episode and only
the model's own tokens carry loss (`episode_rollout.py`).
pi_old is the policy that sampled: its log-probs kept by the sampler when mu > 1 (scored by one
forward pass if the sampler cannot keep them), the detached current policy when mu = 1.
How completions are decoded and log-probs computed is the backend's (`backend.py`: the plain
reference path, or the fast one); the step is the same for both.
On N processes (torch.distributed, FSDP2) the step is the same; what differs is asked of
`run.world` (`distributed.py`: one process answers with the identity). Left out: reward-model
updates (the paper's iterative RL). Same spec and seed on CPU give the same metrics step for
step, also across a resume, and on 1 or N processes (up to float summation order).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from workers.environments import EnvironmentSession
from workers.grpo.advantages import group_advantages, zero_std_group_fraction
from workers.grpo.checkpoint import NotResumable, check_resumable
from workers.grpo.config import TrainSpec
from workers.grpo.device import next_device
from workers.grpo.episode_rollout import EpisodeRollout, Played
from workers.grpo.evaluation import evaluate
from workers.grpo.flat_rewards import FlatRewardWatch
from workers.grpo.loss import loss_denominator
from workers.grpo.policy import BaseWeights, ModelLoadError
from workers.grpo.rollout import Rollout, collect_rollout
from workers.grpo.rollout_rows import rollout_rows
from workers.grpo.run import Run, TrainHooks, TrainResult, open_run, rollouts_ahead, save_step
from workers.grpo.sampling import Generation
from workers.grpo.scoring import Scored, Scorer
from workers.grpo.update import accumulate_gradients, batch_logprobs
from workers.grpo.verifier_errors import (
    VerifierErrorWatch,
    VerifiersFailing,
    error_share,
    first_failure,
)

__all__ = [
    "ModelLoadError",
    "NonFiniteTraining",
    "NotResumable",
    "Scorer",
    "TrainHooks",
    "TrainResult",
    "VerifiersFailing",
    "train",
]


class NonFiniteTraining(RuntimeError):
    """The loss or the gradient norm became NaN or infinite: the weights are lost from this step
    on, so the run stops before it reports or saves anything of it."""


def train(
    spec: TrainSpec,
    records: list[dict],
    scorers: Sequence[Scorer],
    work_dir: Path,
    hooks: TrainHooks,
    *,
    resume_from: Path | None = None,
    device: str | None = None,
    rollout_devices: int = 0,
    eval_records: list[dict] | None = None,
    eval_scorers: Sequence[Scorer] | None = None,
    weights: BaseWeights | None = None,
    environment: EnvironmentSession | None = None,
) -> TrainResult:
    """Run `spec.grpo.steps` GRPO steps (from the checkpoint's step + 1 when resuming).

    `rollout_devices` 1 (with `grpo.max_off_policy_steps` >= 1): the generator samples on the
    device after the trainer's (`device.next_device`), with a whole copy of the model there.
    With `eval_records`, the policy is evaluated every `spec.eval_every` steps and at the last
    step with `eval_scorers` (default: the training `scorers`). With `environment` (the open
    session of `spec.environment`), every completion is an episode (`episode_rollout.py`).
    """
    if (environment is None) != (spec.environment is None):
        raise ValueError("spec.environment and the environment session come together")
    if resume_from is not None:
        check_resumable(resume_from)  # before any model is loaded: a final one has no state
    run = open_run(spec, records, scorers, hooks, resume_from, device, weights)
    if environment is not None and spec.environment is not None:
        max_turns = spec.environment.max_turns
        run.episodes = EpisodeRollout.of(environment, run.policy, max_turns, run.generator)
    run.eval_records, run.eval_scorers = list(eval_records or []), list(eval_scorers or scorers)
    if rollout_devices:  # the generator decodes on the next device
        if not spec.grpo.max_off_policy_steps:
            raise ValueError("rollout_devices needs grpo.max_off_policy_steps >= 1")
        run.rollout_device = next_device(next(run.policy.model.parameters()).device)
    if spec.grpo.max_off_policy_steps:
        run.ahead = rollouts_ahead(run, run.saved_ahead)
        run.ahead.begin()
    try:
        return _loop(run, resume_from, Path(work_dir) / "checkpoints")
    finally:
        if run.ahead is not None:
            run.ahead.close()


def _loop(run: Run, resume_from: Path | None, checkpoints: Path) -> TrainResult:
    """Steps until the last one, a stop or a release; checkpoints on the spec's cadence."""
    spec, hooks = run.spec, run.hooks
    last, saved_step = resume_from, run.step
    flat = FlatRewardWatch()  # steps whose groups all scored alike: said once per streak
    failing = VerifierErrorWatch()  # failed scores: a warning, or the run fails
    for step in range(run.step + 1, spec.grpo.steps + 1):
        if run.world.agree(hooks.should_release()):
            if run.step > saved_step:
                last = save_step(run, checkpoints)
            return TrainResult(run.step, True, last, released=True)
        if run.world.agree(hooks.should_stop()):
            return TrainResult(run.step, True, last)
        metrics = grpo_step(run)
        if run.meter is not None:  # so the submission's memory plan can be checked
            metrics["peak_memory_bytes"] = float(run.meter.peak())
        _check_finite(metrics, step)
        if (said := failing.observe(step, error_share(metrics), run.first_failure)) is not None:
            hooks.on_event("warning", *said)
        run.step = step
        if run.eval_records:
            run.watch.observe_step(metrics["reward_mean"])
            if step % spec.eval_every == 0 or step == spec.grpo.steps:
                metrics |= _evaluate(run)
        hooks.on_step(step, metrics)
        if (warning := flat.observe(step, metrics["frac_zero_std_groups"])) is not None:
            hooks.on_event("warning", *warning)
        if step % spec.checkpoint_every == 0 or step == spec.grpo.steps:
            last = save_step(run, checkpoints)
            saved_step = step
    return TrainResult(run.step, False, last)


def grpo_step(run: Run) -> dict[str, float]:
    """One GRPO step (Shao et al., 2024, Algorithm 1, one outer iteration); returns its metrics."""
    g, gen, model, backend = run.spec.grpo, run.spec.generation, run.policy.model, run.backend
    world = run.world
    t_start = time.perf_counter()
    # 1-3. prompts -> G completions each -> rewards (flat groups refilled if asked); with
    # off-policy steps, made ahead by the generator thread with its log-probs and lag
    roll, sampler_lp, lag = _rollout(run)
    out, rewards = roll.generation, roll.rewards  # rewards (N,)
    run.first_failure = first_failure(roll.errors, out.texts)  # for the verifier-error watch
    t_scored = time.perf_counter()
    # 4. group-relative advantages; the tokens that carry loss (episodes: the model's own)
    advantages = group_advantages(rewards, g.group_size, g.std).to(model.device)  # (N,)
    loss_mask = out.sampled_mask  # (N, T)
    if g.mask_truncated_completions:
        keep = (~out.truncated).to(loss_mask.device, loss_mask.dtype)  # (N,)
        loss_mask = loss_mask * keep.unsqueeze(1)  # (N, T)
    # 5. pi_ref for the KL (skipped at beta = 0) and pi_old when the batch is reused mu times
    temp, mb, packed = gen.temperature, g.micro_batch_size, g.micro_batch_tokens
    ref_lp = old_lp = None
    # Before the first update the policy is pi_ref (a copy; LoRA: B = 0): KL 0, gradient 0.
    # Not scored then: a KL of two forwards that differ by float rounding (the replayed one,
    # say) has a gradient of rounding noise, which Adam's first step would scale up to lr.
    if g.beta > 0 and run.optimizer.state:
        ref, ref_ctx = run.policy.reference, run.policy.reference_context
        with run.autocast():
            ref_lp = batch_logprobs(ref, out, temp, mb, ref_ctx, backend, packed)  # (N, T)
    if g.num_iterations > 1:  # pi_old: kept by the sampler (on-policy), else scored once now
        old_lp = out.logprobs if run.ahead is None else None
        if old_lp is None:
            with run.autocast():
                old_lp = batch_logprobs(
                    model, out, temp, mb, backend=backend, micro_batch_tokens=packed
                )  # (N, T)
    # 6. mu optimisation passes over the batch: loss, backward, clip, AdamW step
    model.train()
    denominator = loss_denominator(loss_mask, g.loss_aggregation, gen.max_new_tokens, world.total)
    learning_rate = run.optimizer.param_groups[0]["lr"]
    passes = []
    for i in range(g.num_iterations):
        stats = accumulate_gradients(
            model, out, loss_mask, advantages, old_lp, ref_lp, g, gen, denominator, i == 0,
            run.autocast, backend, sampler_lp,
        )  # fmt: skip
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(run.params, g.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        passes.append(world.pass_stats(stats, loss_mask, out.sampled_mask))
    run.scheduler.step()
    if run.ahead is not None:  # the generator's weights for the batches still to sample
        run.ahead.publish(run.step + 1, run.params)
    t_end = time.perf_counter()
    rows = rollout_rows(
        run.step + 1, "train", run.policy.tokenizer, roll.records, run.record_ids(roll.records),
        out, rewards, roll.scores, roll.errors, advantages, roll.transcripts, roll.turn_rewards,
    )  # fmt: skip
    run.hooks.on_rollouts(run.step + 1, "train", rows)
    # 7. metrics of the whole batch (all processes): every scalar leaves the device here, once
    lengths = world.gather(out.sampled_mask.sum(1))  # (N,) sampled tokens
    first = world.gather(roll.first_rewards)  # (N,) the first draw: an unbiased estimate
    advantages, truncated = world.gather(advantages), world.gather(out.truncated)  # (N,)
    metrics = world.metrics(roll.metrics) | {
        k: sum(_f(p[k]) for p in passes) / len(passes) for k in passes[0] if k != "entropy"
    }
    metrics |= {
        "reward_mean": first.mean().item(),
        "reward_std": first.std(unbiased=False).item(),
        "frac_zero_std_groups": zero_std_group_fraction(first, g.group_size),
        "advantage_abs_mean": advantages.abs().mean().item(),
        "entropy": _f(passes[0]["entropy"]),
        "completion_len_mean": lengths.mean().item(),
        "truncated_frac": truncated.float().mean().item(),
        "learning_rate": learning_rate,
        "step_seconds": t_end - t_start,
        "tokens_per_second": lengths.sum().item() / (t_end - t_start),
        "training_seconds": t_end - t_scored,
        # prompt + loss-carrying completion tokens through each of the mu training passes
        # (episodes: + the observation and tool tokens, fed without loss)
        "trained_tokens": g.num_iterations
        * world.total(
            out.prompt_mask.sum() + loss_mask.sum() + (out.completion_mask - out.sampled_mask).sum()
        ).item(),
        "world_size": float(world.size),
    }
    if lag is not None:  # every row of a batch was sampled by the same policy
        metrics["off_policy_steps_mean"] = float(lag)
    return metrics


def _rollout(run: Run) -> tuple[Rollout, Tensor | None, int | None]:
    """This step's batch, its sampler's log-probs (N, T) and lag in optimiser steps: sampled
    now by the trained policy (None, None), or made ahead (`off_policy.py`)."""
    if run.ahead is not None:
        batch = run.ahead.next()
        for event in batch.events:  # raised on the generator's thread, reported from this one
            run.hooks.on_event(*event)
        return batch.rollout, batch.sampler_logprobs, run.step - batch.version
    g, model, world = run.spec.grpo, run.policy.model, run.world
    model.eval()
    with world.rollout(model), run.autocast():
        roll = collect_rollout(
            run.draw, run.sampler, run.scorers, world.local(g), run.spec.generation,
            _pad_id(run), run.hooks.on_event, run.episodes,
        )  # fmt: skip
    return roll, None, None


def _check_finite(metrics: dict[str, float], step: int) -> None:
    bad = [k for k in ("loss", "grad_norm") if not math.isfinite(metrics.get(k, 0.0))]
    if bad:
        values = ", ".join(f"{k} = {metrics[k]}" for k in bad)
        raise NonFiniteTraining(
            f"step {step}: {values}; the weights are no longer usable, nothing of this step was"
            " saved (lower the learning rate, or check the rewards' scale)"
        )


def _f(value: Any) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _pad_id(run: Run) -> int:
    tok = run.policy.tokenizer
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def _evaluate(run: Run) -> dict[str, float]:
    """Held-out metrics of this step; emits `reward_hacking_suspected` when the watch fires."""
    run.policy.model.eval()
    batches: list[tuple[list[dict], Generation, Scored, Played | None]] = []
    metrics = evaluate(
        run.sampler,
        run.generator,
        run.eval_records,
        run.eval_scorers,
        run.spec.generation,
        run.hooks.on_event,
        run.autocast,
        on_batch=lambda *batch: batches.append(batch),
        episodes=run.episodes,  # an environment's job is evaluated on its episodes
    )
    for records, out, scored, played in batches:  # eval records first: index = position
        ids, tok = list(range(len(records))), run.policy.tokenizer
        rows = rollout_rows(
            run.step, "eval", tok, records, ids, out, scored.rewards, scored.scores,
            scored.errors, None, played.transcripts if played is not None else None,
            played.turn_rewards if played is not None else None,
        )  # fmt: skip
        run.hooks.on_rollouts(run.step, "eval", rows)
    alarm = run.watch.observe_eval(metrics["eval_reward_mean"])
    if alarm is not None:
        message = (
            f"training reward rose ({alarm['train_slope']:+.3f}/eval) while held-out reward fell"
            f" ({alarm['eval_slope']:+.3f}/eval) over the last {alarm['window']} evaluations"
        )
        run.hooks.on_event("reward_hacking_suspected", message, {"step": run.step, **alarm})
    return metrics
