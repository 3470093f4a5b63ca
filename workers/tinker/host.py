"""LoraHost: one base model loaded once, many Tinker training runs on it (issue 35).

Each run is a peft adapter on the shared base (`adapters.AdapterStack`) with its own AdamW
state over that adapter's matrices only, its step count and its pending gradients. A request
sets its run's adapter active, so what one run computes never depends on the others
(interleaved or alone: the same numbers). Past `max_resident_runs`, the least recently used
run is evicted to `state_dir` (adapter, optimiser state, pending gradients) and reloaded on
its next request, exactly as it was.

Single-threaded: the caller serialises requests (one at a time per host).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from workers.grpo.draw import fresh_base
from workers.losses.terms import LOSSES
from workers.models.loading import load_pretrained
from workers.models.lora import linear_layers
from workers.tinker import validation as check
from workers.tinker.adapters import AdapterStack, peft_config
from workers.tinker.batches import micro_batches
from workers.tinker.finite import NotFinite, Snapshot, finite, grads
from workers.tinker.loss_pass import micro_batch_loss
from workers.tinker.sampler import Draw, StopRule, sample_sequences
from workers.tinker.types import (
    AdamParams,
    Datum,
    Deadline,
    ForwardResult,
    LoraConfig,
    SampleResult,
    SamplingParams,
    TimeLimitExceeded,
    TinkerInputError,
)

MAX_SAMPLER_ADAPTERS = 4  # sampler-weights directories kept loaded (reloaded when dropped)


@dataclass
class Run:
    name: str  # its peft adapter's name (run ids may hold characters module names cannot)
    config: LoraConfig
    steps: int = 0
    optimizer: torch.optim.AdamW | None = None  # None while evicted

    def resident_optimizer(self) -> torch.optim.AdamW:
        """The optimiser of a resident run (`LoraHost._load` makes one resident)."""
        if self.optimizer is None:
            raise RuntimeError(f"run {self.name} is evicted: its optimiser is on disk")
        return self.optimizer


class LoraHost:
    def __init__(
        self,
        base_model_dir: str | Path,
        *,
        device: str = "cpu",
        state_dir: Path,
        max_resident_runs: int = 16,
        dtype: str | None = None,
    ) -> None:
        """The base is frozen: its weights load as the model loader loads frozen weights
        (bf16 on a GPU, fp32 on CPU) unless `dtype` names one (`float32` on a GPU). Adapters,
        their Adam state and the losses stay fp32 (peft keeps adapters fp32 on a bf16 base)."""
        chosen = None if dtype is None else getattr(torch, dtype)
        loaded = load_pretrained(base_model_dir, device, frozen=True, dtype=chosen)
        self.tokenizer, self.model = loaded.tokenizer, loaded.model
        self.adapters = AdapterStack(self.model, str(base_model_dir))
        self.layers = linear_layers(self.model)
        config = self.model.config
        self.limits = check.ModelLimits(config.vocab_size, config.max_position_embeddings)
        self.max_resident = max(1, max_resident_runs)
        # a folder of this host's own: hosts that share a state_dir never read each other's runs
        self.state_dir = Path(state_dir) / f"host-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._runs: dict[str, Run] = {}
        self._resident: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._samplers: OrderedDict[str, str] = OrderedDict()  # weights dir -> adapter name
        self._names = 0

    # runs

    def create_run(self, run_id: str, config: LoraConfig) -> None:
        if run_id in self._runs:
            raise TinkerInputError("model_id", f"run {run_id!r} exists")
        check.check_lora(config, self._leaf_names())
        peft = self._peft_config(config)
        if not peft.target_modules:
            raise TinkerInputError("lora_config", "selects no layer of this model (train_* flags)")
        run = Run(self._new_name("run"), config)
        self._make_room()
        params = self.adapters.add(run.name, peft, config.seed or 0)
        run.optimizer = _adamw(params)
        self._runs[run_id] = run
        self._resident[run_id] = None

    def has_run(self, run_id: str) -> bool:
        return run_id in self._runs

    def resident_runs(self) -> list[str]:
        return list(self._resident)

    def delete_run(self, run_id: str) -> None:
        run = self._get(run_id)
        if run_id in self._resident:
            self.adapters.remove(run.name)
            del self._resident[run_id]
        shutil.rmtree(self._evicted_dir(run), ignore_errors=True)
        del self._runs[run_id]

    # training

    def forward(
        self,
        run_id: str,
        data: list[Datum],
        loss_fn: str,
        loss_fn_config: dict | None = None,
        deadline: Deadline | None = None,
    ) -> ForwardResult:
        return self._loss_pass(run_id, data, loss_fn, loss_fn_config, False, deadline)

    def forward_backward(
        self,
        run_id: str,
        data: list[Datum],
        loss_fn: str,
        loss_fn_config: dict | None = None,
        deadline: Deadline | None = None,
    ) -> ForwardResult:
        """Adds this batch's gradients to the run's (summed until `optim_step`). Past
        `deadline` it stops at the next micro-batch and takes its gradients back."""
        return self._loss_pass(run_id, data, loss_fn, loss_fn_config, True, deadline)

    def optim_step(self, run_id: str, adam: AdamParams) -> dict[str, float]:
        """One AdamW step (decoupled weight decay) on the run's summed gradients, then zero them.
        A step that would leave a weight not finite is undone and refused: the run, its
        pending gradients included, stays as it was."""
        check.check_adam(adam)
        run = self._load(run_id)
        params, optimizer = self.adapters.parameters(run.name), run.resident_optimizer()
        before = Snapshot(params, optimizer)
        clip = adam.grad_clip_norm if adam.grad_clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if not torch.isfinite(grad_norm):
            before.restore(params, optimizer)
            raise NotFinite("adam_params", "the gradients' norm is not finite: nothing was changed")
        for group in optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)  # fmt: skip
        try:
            optimizer.step()
            stepped = finite(params)
        except RuntimeError:  # torch refuses a step size that float32 cannot hold
            stepped = False
        if not stepped:
            before.restore(params, optimizer)
            raise NotFinite(
                "adam_params.learning_rate",
                "this step makes the adapter's weights not finite (is the learning rate too "
                "large?): it was undone, the run and its pending gradients are as before",
            )
        optimizer.zero_grad(set_to_none=True)
        run.steps += 1
        return {"grad_norm": float(grad_norm), "learning_rate": adam.learning_rate,
                "step": float(run.steps)}  # fmt: skip

    def _loss_pass(
        self,
        run_id: str,
        data: list[Datum],
        loss_fn: str,
        config: dict | None,
        train: bool,
        deadline: Deadline | None,
    ) -> ForwardResult:
        """A loss, log-prob or gradient that is not finite refuses the whole batch, and a pass
        past its deadline stops at the next micro-batch: either way its gradients are taken
        back, so the run stays as it was before the request."""
        spec, cfg = check.check_loss(loss_fn, config)
        check.check_data(data, spec, self.limits)
        # target_tokens pick the log-probs; the term reads the datum's other inputs as tensors
        term, tensors = LOSSES[spec.name], set(spec.inputs) - {"target_tokens"}
        run = self._load(run_id)
        params = self.adapters.parameters(run.name)
        before = Snapshot(params) if train else None
        chunks = micro_batches(data, self.limits.vocab_size)
        outputs: list[dict[str, list[float]]] = []
        total, ok = 0.0, True
        try:
            with self.adapters.active(run.name), torch.set_grad_enabled(train):
                for done, chunk in enumerate(chunks):  # the loss is a sum: backwards add up
                    if deadline is not None:
                        deadline.check(done, len(chunks), "micro-batches")
                    loss, finite_chunk = micro_batch_loss(
                        self.model, chunk, term, tensors, cfg, outputs
                    )
                    if train:
                        loss.backward()
                    total, ok = total + float(loss.detach()), ok and finite_chunk
        except TimeLimitExceeded:
            if before is not None:
                before.restore(params)
            raise
        if not (ok and math.isfinite(total) and (not train or finite(grads(params)))):
            if before is not None:
                before.restore(params)
            raise NotFinite(
                "data",
                f"the loss is not finite (loss:sum {total}): weights or advantages too large "
                "for float32, or a run whose weights diverged; "
                + ("this batch's gradients were discarded" if train else "nothing was changed"),
            )
        return ForwardResult(outputs, {"loss:sum": total})

    # sampling

    def sample(
        self,
        weights: str | None,
        prompt: list[int],
        num_samples: int,
        params: SamplingParams,
        prompt_logprobs: bool = False,
        deadline: Deadline | None = None,
    ) -> SampleResult:
        """`weights`: a run id (its adapter now), a directory `save_for_sampler` wrote (or any
        peft LoRA adapter of this base), or None (the base model). Past `deadline` it stops
        at the next decoding step."""
        steps = check.check_sample(prompt, num_samples, params, self.limits)
        ids, strings = check.stop_rule(params.stop, self.tokenizer.eos_token_id, self.limits)
        rule = StopRule(frozenset(ids), tuple(strings))
        seed = params.seed if params.seed is not None else fresh_base()
        draw = Draw(params.temperature, params.top_k, params.top_p)
        with self.adapters.active(self._sampling_adapter(weights)):
            seqs, first = sample_sequences(self.model, self.tokenizer, prompt, num_samples, draw,
                                           steps, rule, seed, prompt_logprobs,
                                           deadline)  # fmt: skip
        kept = [lp for seq in seqs for lp in seq.logprobs] + [
            lp for lp in first or [] if lp is not None
        ]
        if not all(math.isfinite(lp) for lp in kept):
            raise NotFinite("weights", "the model's log-probs are not finite (do its weights "
                            "hold NaN or Infinity?)")  # fmt: skip
        return SampleResult(seqs, first)

    def _sampling_adapter(self, weights: str | None) -> str | None:
        if weights is None:
            return None
        if weights in self._runs:
            return self._load(weights).name
        path = Path(weights)
        if not (path / "adapter_config.json").is_file():
            raise TinkerInputError("weights", f"neither a run nor sampler weights: {weights!r}")
        weights_file = path / "adapter_model.safetensors"
        if not weights_file.is_file():
            raise TinkerInputError("weights", f"no adapter_model.safetensors in {weights!r}")
        key = f"{path.resolve()}@{weights_file.stat().st_mtime_ns}"  # rewritten: loaded again
        if key not in self._samplers:
            if len(self._samplers) >= MAX_SAMPLER_ADAPTERS:
                _, old = self._samplers.popitem(last=False)
                self.adapters.remove(old)
            name = self._new_name("smp")
            self.adapters.load_peft_dir(name, path)
            self._samplers[key] = name
        self._samplers.move_to_end(key)
        return self._samplers[key]

    # state

    def save_state(self, run_id: str, path: Path) -> None:
        """The adapter, the optimiser state and the step count, to resume training exactly."""
        run = self._load(run_id)
        path = Path(path)
        self.adapters.write_peft_dir(run.name, path)
        torch.save(run.resident_optimizer().state_dict(), path / "optimizer.pt")
        meta = {"config": asdict(run.config), "steps": run.steps}
        (path / "run.json").write_text(json.dumps(meta))

    def load_state(self, run_id: str, path: Path, *, with_optimizer: bool = True) -> None:
        """Into run `run_id` (created when new, replaced when it exists). The state is loaded
        into a new run first: one that does not fit leaves an existing run as it was."""
        path = Path(path)
        try:
            meta = json.loads((path / "run.json").read_text())
            config, steps = LoraConfig(**meta["config"]), int(meta["steps"])
            adapter = load_file(str(path / "adapter_model.safetensors"))
            optimizer = self._optimizer_state(path) if with_optimizer else None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise TinkerInputError("path", f"no training state at {str(path)!r}") from exc
        staging = f"\0loading {run_id}"
        self.create_run(staging, config)
        run = self._runs[staging]
        try:
            self.adapters.load_adapter_state(run.name, adapter)
            if optimizer is not None:
                run.resident_optimizer().load_state_dict(optimizer)
                run.steps = steps
        except (ValueError, RuntimeError, KeyError) as exc:
            self.delete_run(staging)
            raise TinkerInputError("path", f"the state does not fit this model: {exc}") from exc
        if run_id in self._runs:
            self.delete_run(run_id)
        self._runs[run_id] = self._runs.pop(staging)
        del self._resident[staging]
        self._resident[run_id] = None

    def save_for_sampler(self, run_id: str, path: Path) -> None:
        """A peft adapter directory: `PeftModel.from_pretrained(base, path)` loads it."""
        self.adapters.write_peft_dir(self._load(run_id).name, Path(path))

    def evict(self, run_id: str) -> None:
        """To `state_dir`, pending gradients included; the next request reloads it."""
        run = self._get(run_id)
        if run_id not in self._resident:
            return
        where = self._evicted_dir(run)
        self.save_state(run_id, where)
        params = self.adapters.parameters(run.name)
        grads = {str(i): p.grad.detach().cpu() for i, p in enumerate(params) if p.grad is not None}
        save_file(grads, str(where / "grads.safetensors"))
        self.adapters.remove(run.name)
        run.optimizer = None
        del self._resident[run_id]

    # residency

    def _get(self, run_id: str) -> Run:
        if run_id not in self._runs:
            raise TinkerInputError("model_id", f"unknown run {run_id!r}")
        return self._runs[run_id]

    def _load(self, run_id: str) -> Run:
        """The run, resident (reloaded from `state_dir` if evicted), most recently used."""
        run = self._get(run_id)
        if run_id not in self._resident:
            self._make_room()
            where = self._evicted_dir(run)
            params = self.adapters.add(run.name, self._peft_config(run.config), 0)
            adapter = load_file(str(where / "adapter_model.safetensors"))
            self.adapters.load_adapter_state(run.name, adapter)
            run.optimizer = _adamw(params)
            run.optimizer.load_state_dict(self._optimizer_state(where))
            for i, grad in load_file(str(where / "grads.safetensors")).items():
                params[int(i)].grad = grad.to(self.model.device)
            shutil.rmtree(where)
            self._resident[run_id] = None
        self._resident.move_to_end(run_id)
        return run

    def _optimizer_state(self, where: Path) -> dict:
        return torch.load(where / "optimizer.pt", map_location=self.model.device, weights_only=True)

    def _make_room(self) -> None:
        while len(self._resident) >= self.max_resident:
            self.evict(next(iter(self._resident)))

    def _leaf_names(self) -> set[str]:
        return {name.rsplit(".", 1)[-1] for name, group in self.layers.items() if group != "tied"}

    def _evicted_dir(self, run: Run) -> Path:
        return self.state_dir / run.name

    def _new_name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names}"

    def _peft_config(self, config: LoraConfig):  # noqa: ANN202 - peft's LoraConfig
        return peft_config(config, self.layers, self.adapters.base_path)


def _adamw(params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
    """Its hyper-parameters are set by each `optim_step` (AdamParams may change per step)."""
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
