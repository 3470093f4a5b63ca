"""The GRPO training loop (Shao et al., 2024, Algorithm 1, outcome supervision).

Each step: take prompts -> sample G completions per prompt -> score with every verifier
(r = sum_k w_k * score_k; DAPO dynamic sampling refills zero-spread groups, `rollout.py`) ->
group-relative advantages -> reference log-probs (beta > 0; none computed at beta = 0) -> for
mu = num_iterations passes: clipped-surrogate + k3-KL loss over micro-batches with gradient
accumulation (`update.py`), grad-norm clip, AdamW step -> lr schedule -> metrics -> held-out
evaluation and the reward-hacking watch (`evaluation.py`) -> checkpoint. With an environment,
each completion is an episode and only the model's own tokens carry loss (`episode_rollout.py`).
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
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.environments import EnvironmentSession
from workers.grpo.advantages import group_advantages, zero_std_group_fraction
from workers.grpo.backend import Backend, select_backend
from workers.grpo.checkpoint import (
    NotResumable,
    check_resumable,
    load_trainer_state,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from workers.grpo.config import TrainSpec
from workers.grpo.data import PromptStream
from workers.grpo.device import autocast_for, default_device, resolve_precision
from workers.grpo.distributed import Ranks, Solo, shard_model, world_of
from workers.grpo.episode_rollout import EpisodeRollout
from workers.grpo.evaluation import HackingWatch, evaluate
from workers.grpo.loss import loss_denominator
from workers.grpo.peak_memory import MemoryMeter
from workers.grpo.policy import BaseWeights, ModelLoadError, Policy, load_policy
from workers.grpo.rollout import collect_rollout
from workers.grpo.rollout_rows import rollout_rows
from workers.grpo.sampling import Generation, Sampler
from workers.grpo.schedule import lr_multiplier
from workers.grpo.scoring import Scored, Scorer
from workers.grpo.sharded import load_optimizer, save_sharded
from workers.grpo.update import accumulate_gradients, batch_logprobs

__all__ = [
    "ModelLoadError",
    "NonFiniteTraining",
    "NotResumable",
    "Scorer",
    "TrainHooks",
    "TrainResult",
    "train",
]


class NonFiniteTraining(RuntimeError):
    """The loss or the gradient norm became NaN or infinite: the weights are lost from this step
    on, so the run stops before it reports or saves anything of it."""


def _noop(*_: Any) -> None:
    return None


@dataclass
class TrainHooks:
    on_step: Callable[[int, dict[str, float]], None] = _noop  # (step, metrics), step 1-based
    on_checkpoint: Callable[[int, Path], None] = _noop  # (step, checkpoint directory)
    should_stop: Callable[[], bool] = lambda: False  # checked at every step boundary
    # Graceful hand-over (worker shutting down): checkpoint the current step, then stop.
    should_release: Callable[[], bool] = lambda: False
    on_event: Callable[[str, str, dict], None] = _noop  # (type, message, data)
    # (step, "train" | "eval", rows): every completion of a step, or of an eval run at that
    # step; the rows' keys are `rollout_rows.ROW_KEYS`.
    on_rollouts: Callable[[int, str, list[dict]], None] = _noop


@dataclass
class TrainResult:
    steps_completed: int
    stopped: bool
    final_checkpoint: Path | None
    released: bool = False  # stopped after checkpointing, for another worker to resume


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
    autocast: Callable[[], Any]
    backend: Backend
    step: int = 0
    params: list[torch.nn.Parameter] = field(default_factory=list)
    eval_records: list[dict] = field(default_factory=list)
    eval_scorers: list[Scorer] = field(default_factory=list)
    watch: HackingWatch = field(default_factory=HackingWatch)
    meter: MemoryMeter | None = None
    world: Solo | Ranks = field(default_factory=Solo)
    episodes: EpisodeRollout | None = None  # a multi-turn environment's: steps play episodes
    _record_index: dict[int, int] = field(default_factory=dict)  # id(record) -> its index

    def draw(self, k: int) -> list[dict]:
        """k records for this process: of the step's k * N, its run."""
        return [self.records[i] for i in self.world.share(self.stream.take(k * self.world.size))]

    def record_ids(self, drawn: list[dict]) -> list[int]:
        """The dataset indices of drawn records (refills included), for the rollout rows."""
        if len(self._record_index) != len(self.records):
            self._record_index = {id(r): i for i, r in enumerate(self.records)}
        return [self._record_index[id(r)] for r in drawn]


def train(
    spec: TrainSpec,
    records: list[dict],
    scorers: list[Scorer],
    work_dir: Path,
    hooks: TrainHooks,
    *,
    resume_from: Path | None = None,
    device: str | None = None,
    eval_records: list[dict] | None = None,
    eval_scorers: list[Scorer] | None = None,
    weights: BaseWeights | None = None,
    environment: EnvironmentSession | None = None,
) -> TrainResult:
    """Run `spec.grpo.steps` GRPO steps (from the checkpoint's step + 1 when resuming).

    With `eval_records`, the policy is evaluated every `spec.eval_every` steps and at the last
    step with `eval_scorers` (default: the training `scorers`). With `environment` (the open
    session of `spec.environment`), every completion is an episode (`episode_rollout.py`).
    """
    if (environment is None) != (spec.environment is None):
        raise ValueError("spec.environment and the environment session come together")
    if resume_from is not None:
        check_resumable(resume_from)  # before any model is loaded: a final one has no state
    run = _setup(spec, records, scorers, hooks, resume_from, device, weights)
    if environment is not None and spec.environment is not None:
        run.episodes = EpisodeRollout.of(environment, run.policy, spec.environment.max_turns)
    run.eval_records, run.eval_scorers = list(eval_records or []), list(eval_scorers or scorers)
    last, saved_step = resume_from, run.step
    checkpoints = Path(work_dir) / "checkpoints"
    for step in range(run.step + 1, spec.grpo.steps + 1):
        if run.world.agree(hooks.should_release()):
            if run.step > saved_step:
                last = _checkpoint(run, checkpoints)
            return TrainResult(run.step, True, last, released=True)
        if run.world.agree(hooks.should_stop()):
            return TrainResult(run.step, True, last)
        metrics = grpo_step(run)
        if run.meter is not None:  # so the submission's memory plan can be checked
            metrics["peak_memory_bytes"] = float(run.meter.peak())
        _check_finite(metrics, step)
        run.step = step
        if run.eval_records:
            run.watch.observe_step(metrics["reward_mean"])
            if step % spec.eval_every == 0 or step == spec.grpo.steps:
                metrics |= _evaluate(run)
        hooks.on_step(step, metrics)
        if step % spec.checkpoint_every == 0 or step == spec.grpo.steps:
            last = _checkpoint(run, checkpoints)
            saved_step = step
    return TrainResult(run.step, False, last)


def grpo_step(run: Run) -> dict[str, float]:
    """One GRPO step (Shao et al., 2024, Algorithm 1, one outer iteration); returns its metrics."""
    g, gen, model, backend = run.spec.grpo, run.spec.generation, run.policy.model, run.backend
    world = run.world
    t_start = time.perf_counter()
    # 1-3. prompts -> G completions each -> rewards (flat groups refilled if asked)
    model.eval()
    with world.rollout(model), run.autocast():
        roll = collect_rollout(
            run.draw, run.sampler, run.scorers, world.local(g), gen, _pad_id(run),
            run.hooks.on_event, run.episodes,
        )  # fmt: skip
    out, rewards = roll.generation, roll.rewards  # rewards (N,)
    t_scored = time.perf_counter()
    # 4. group-relative advantages; the tokens that carry loss (episodes: the model's own)
    advantages = group_advantages(rewards, g.group_size, g.std).to(model.device)  # (N,)
    loss_mask = out.sampled_mask  # (N, T)
    if g.mask_truncated_completions:
        keep = (~out.truncated).to(loss_mask.device, loss_mask.dtype)  # (N,)
        loss_mask = loss_mask * keep.unsqueeze(1)  # (N, T)
    # 5. pi_ref for the KL (skipped at beta = 0) and pi_old when the batch is reused mu times
    temp, mb = gen.temperature, g.micro_batch_size
    ref_lp = old_lp = None
    # Before the first update the policy is pi_ref (a copy; LoRA: B = 0): KL 0, gradient 0.
    # Not scored then: a KL of two forwards that differ by float rounding (the replayed one,
    # say) has a gradient of rounding noise, which Adam's first step would scale up to lr.
    if g.beta > 0 and run.optimizer.state:
        ref, ref_ctx = run.policy.reference, run.policy.reference_context
        with run.autocast():
            ref_lp = batch_logprobs(ref, out, temp, mb, ref_ctx, backend)  # (N, T)
    if g.num_iterations > 1:  # pi_old: kept by the sampler, else scored once now
        old_lp = out.logprobs
        if old_lp is None:
            with run.autocast():
                old_lp = batch_logprobs(model, out, temp, mb, backend=backend)  # (N, T)
    # 6. mu optimisation passes over the batch: loss, backward, clip, AdamW step
    model.train()
    denominator = loss_denominator(loss_mask, g.loss_aggregation, gen.max_new_tokens, world.total)
    learning_rate = run.optimizer.param_groups[0]["lr"]
    passes = []
    for i in range(g.num_iterations):
        stats = accumulate_gradients(
            model, out, loss_mask, advantages, old_lp, ref_lp, g, gen, denominator, i == 0,
            run.autocast, backend,
        )  # fmt: skip
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(run.params, g.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        passes.append(world.pass_stats(stats, loss_mask, out.sampled_mask))
    run.scheduler.step()
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
    return metrics


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
    batches: list[tuple[list[dict], Generation, Scored]] = []
    metrics = evaluate(
        run.sampler,
        run.generator,
        run.eval_records,
        run.eval_scorers,
        run.spec.generation,
        run.hooks.on_event,
        run.autocast,
        on_batch=lambda *batch: batches.append(batch),
    )
    for records, out, scored in batches:  # eval records are the first ones: index = position
        ids, tok = list(range(len(records))), run.policy.tokenizer
        rows = rollout_rows(
            run.step, "eval", tok, records, ids, out, scored.rewards, scored.scores,
            scored.errors, None,
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
    weights: BaseWeights | None = None,
) -> Run:
    device = device or default_device()
    g = spec.grpo
    _seed_everything(g.seed)
    meter = MemoryMeter(device)  # before the weights: the peak counts them
    precision = resolve_precision(spec.precision, device)
    policy = load_policy(spec, device, resume_from, weights, precision)
    world = world_of(g)
    if world.size > 1:  # FSDP2 units gather and reduce through the model's own forward
        shard_model(policy.model)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    if spec.gradient_checkpointing:  # the model's own forward recomputes: the fast one cannot
        policy.model.gradient_checkpointing_enable({"use_reentrant": False})
    own_forward = spec.gradient_checkpointing or world.size > 1
    backend = select_backend(policy.model, g, own_forward=own_forward)
    for model in {id(m): m for m in (policy.model, policy.reference) if m is not None}.values():
        backend.prepare(model)
    # The fused kernel updates every tensor in one op, where the default loops over them.
    optimizer = torch.optim.AdamW(
        params, lr=g.learning_rate, weight_decay=g.weight_decay, fused=True
    )
    factor = lr_multiplier(g.lr_schedule, g.warmup_steps, g.steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    generator = torch.Generator(device=device).manual_seed(g.seed)
    sampler = world.sampler(
        backend.sampler(policy.model, policy.tokenizer, generator), g.group_size
    )
    stream = PromptStream(len(records), g.seed)
    run = Run(
        spec, policy, sampler, generator, optimizer, scheduler, stream, records, scorers, hooks,
        autocast_for(device, precision), backend, params=params, meter=meter, world=world,
    )  # fmt: skip
    if resume_from is not None:
        state = load_trainer_state(Path(resume_from))
        load_optimizer(Path(resume_from), state, policy.model, optimizer)
        scheduler.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["data"])
        set_rng_state(state["rng"], generator)
        if "watch" in state:
            run.watch.load_state_dict(state["watch"])
        run.step = state["step"]
        _take_spec_rates(run, factor)
    return run


def _take_spec_rates(run: Run, factor: Callable[[int], float]) -> None:
    """The spec's peak learning rate and weight decay over the ones the checkpoint restored
    (a fork may change them; the same spec gives back exactly the saved values): the next
    update runs at learning_rate * factor(updates so far), as LambdaLR computes it."""
    g = run.spec.grpo
    for group in run.optimizer.param_groups:
        group.update(initial_lr=g.learning_rate, weight_decay=g.weight_decay)
        group["lr"] = g.learning_rate * factor(run.scheduler.last_epoch)
    run.scheduler.base_lrs = [g.learning_rate] * len(run.optimizer.param_groups)
    run.scheduler._last_lr = [group["lr"] for group in run.optimizer.param_groups]


def _checkpoint(run: Run, root: Path) -> Path:
    """Save the current step, hand it to the hook, then drop the local copies that
    `keep_checkpoints` no longer keeps (after the hook: it may still be uploading one)."""
    directory = _save(run, root / f"step-{run.step:06d}")
    run.hooks.on_checkpoint(run.step, directory)
    prune_checkpoints(root, run.spec.keep_checkpoints, run.spec.grpo.steps)
    return directory


def _save(run: Run, directory: Path) -> Path:
    # The final checkpoint is the model alone: no run resumes from it, and the optimizer
    # state (AdamW's two moments per trained weight) would be most of the archive.
    state = None if run.step == run.spec.grpo.steps else _trainer_state(run)
    save = save_checkpoint if run.world.size == 1 else save_sharded(run.optimizer)
    return save(
        directory, run.policy.model, run.policy.tokenizer, run.spec, state, run.policy.save_dtype
    )


def _trainer_state(run: Run) -> dict[str, Any]:
    return {
        "step": run.step,
        # N processes: each holds a shard, saved by torch.distributed.checkpoint (`sharded.py`)
        **({"optimizer": run.optimizer.state_dict()} if run.world.size == 1 else {}),
        "scheduler": run.scheduler.state_dict(),
        "data": run.stream.state_dict(),
        "rng": rng_state(run.generator),
        "watch": run.watch.state_dict(),
    }
