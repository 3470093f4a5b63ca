"""One training run's state and its life outside the step: building it (model, optimizer,
schedule, sampler, a resumed checkpoint's state, with off-policy steps the generator that
makes rollouts ahead: `off_policy.py`) and saving it at a step boundary.

`trainer.py` holds the loop and the step; everything a step reads or updates is a `Run`.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from workers.grpo.backend import Backend, select_backend
from workers.grpo.checkpoint import (
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
from workers.grpo.evaluation import HackingWatch
from workers.grpo.off_policy import RolloutsAhead, SerializedScorer, generator_copy
from workers.grpo.peak_memory import MemoryMeter
from workers.grpo.policy import BaseWeights, Policy, load_policy
from workers.grpo.rollout import Rollout, collect_rollout
from workers.grpo.sampling import Sampler
from workers.grpo.schedule import lr_multiplier
from workers.grpo.scoring import Scorer
from workers.grpo.text import pad_id
from workers.grpo.update import batch_logprobs
from workers.grpo.verifier_errors import FirstFailure

if TYPE_CHECKING:
    from workers.grpo.sharded import Save  # loaded with torch.distributed, for N > 1 processes


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
    scorers: Sequence[Scorer]
    hooks: TrainHooks
    autocast: Callable[[], Any]
    backend: Backend
    step: int = 0
    params: list[torch.nn.Parameter] = field(default_factory=list)
    eval_records: list[dict] = field(default_factory=list)
    eval_scorers: Sequence[Scorer] = field(default_factory=list)
    watch: HackingWatch = field(default_factory=HackingWatch)
    meter: MemoryMeter | None = None
    world: Solo | Ranks = field(default_factory=Solo)
    episodes: EpisodeRollout | None = None  # a multi-turn environment's: steps play episodes
    # max_off_policy_steps >= 1: the generator thread (`off_policy.py`), and the cursor state
    # a resumed checkpoint saved for it
    ahead: RolloutsAhead | None = None
    saved_ahead: dict[str, Any] | None = None
    rollout_device: str | None = None  # the generator's device (None: the trainer's)
    first_failure: FirstFailure | None = None  # the last step's first failed score
    _record_index: dict[int, int] = field(default_factory=dict)  # id(record) -> its index

    def draw(self, k: int) -> list[dict]:
        """k records for this process: of the step's k * N, its run."""
        return [self.records[i] for i in self.world.share(self.stream.take(k * self.world.size))]

    def record_ids(self, drawn: list[dict]) -> list[int]:
        """The dataset indices of drawn records (refills included), for the rollout rows."""
        if len(self._record_index) != len(self.records):
            self._record_index = {id(r): i for i, r in enumerate(self.records)}
        return [self._record_index[id(r)] for r in drawn]


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def open_run(
    spec: TrainSpec,
    records: list[dict],
    scorers: Sequence[Scorer],
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
        # transformers 5 renamed it (the old name warns, and goes in v6); 4.x has the old one only
        model = policy.model
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)({"use_reentrant": False})
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
        # torch.distributed.checkpoint is slow to import: only a resume or N ranks need it
        from workers.grpo.sharded import load_optimizer

        load_optimizer(Path(resume_from), state, policy.model, optimizer)
        scheduler.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["data"])
        set_rng_state(state["rng"], generator)
        if "watch" in state:
            run.watch.load_state_dict(state["watch"])
        run.saved_ahead = state.get("off_policy")
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


def save_step(run: Run, root: Path) -> Path:
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
    save: Save
    if run.world.size == 1:
        save = save_checkpoint
    else:
        from workers.grpo.sharded import save_sharded

        save = save_sharded(run.optimizer)
    return save(
        directory, run.policy.model, run.policy.tokenizer, run.spec, state, run.policy.save_dtype
    )


def _trainer_state(run: Run) -> dict[str, Any]:
    # Off-policy: the generator has drawn ahead; what resumes is the cursor after the batch
    # trained on last (`off_policy.py`: a resumed run samples the batches in flight again).
    ahead = None if run.ahead is None else run.ahead.resume_state
    return {
        "step": run.step,
        # N processes: each holds a shard, saved by torch.distributed.checkpoint (`sharded.py`)
        **({"optimizer": run.optimizer.state_dict()} if run.world.size == 1 else {}),
        "scheduler": run.scheduler.state_dict(),
        "data": run.stream.state_dict() if ahead is None else ahead["data"],
        "rng": rng_state(run.generator),
        "watch": run.watch.state_dict(),
        **({} if ahead is None else {"off_policy": {"sampler": ahead["sampler"]}}),
    }


def rollouts_ahead(run: Run, saved: dict[str, Any] | None) -> RolloutsAhead:
    """The generator of `run` (not started): its model copy, decoder and sampling generator
    (from the checkpoint's `saved` state, else the run's). The scorers it gets and those of
    `run.eval_scorers` then score one batch at a time."""
    g, gen, tokenizer = run.spec.grpo, run.spec.generation, run.policy.tokenizer
    if run.world.size > 1 or run.episodes is not None:  # refused at submission (`world.py`)
        raise ValueError("max_off_policy_steps runs on one process, without episodes")
    model = generator_copy(run.policy.model, run.rollout_device)
    trained = [p for p in model.parameters() if p.requires_grad]
    # the job's engine; no decode records: no trainer's forward could use them
    backend = select_backend(model, g, record=False)
    backend.prepare(model)
    generator = torch.Generator(device=run.generator.device)
    generator.set_state(run.generator.get_state() if saved is None else saved["sampler"])
    sampler = backend.sampler(model, tokenizer, generator)
    lock = threading.Lock()  # one batch scored at a time, by either thread
    scorers = [SerializedScorer(s, lock) for s in run.scorers]

    def make_batch(on_event: Callable[[str, str, dict], None]) -> tuple[Rollout, Tensor, dict]:
        with run.autocast():
            roll = collect_rollout(run.draw, sampler, scorers, g, gen, pad_id(tokenizer), on_event)
        lp = batch_logprobs(  # (N, T) under the weights that sampled
            model, roll.generation, gen.temperature, g.micro_batch_size, run.autocast, backend,
            micro_batch_tokens=g.micro_batch_tokens,
        )  # fmt: skip
        return roll, lp, {"data": run.stream.state_dict(), "sampler": generator.get_state()}

    run.eval_scorers = [SerializedScorer(s, lock) for s in run.eval_scorers]
    # batches made on a rollout device are moved to the trainer's (on a CPU: the same tensors)
    home = next(run.policy.model.parameters()).device if run.rollout_device else None
    return RolloutsAhead(make_batch, trained, g.max_off_policy_steps, run.step, g.steps, home)
