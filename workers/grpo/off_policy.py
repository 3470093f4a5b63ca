"""Off-policy steps, bounded (`grpo.max_off_policy_steps` = K >= 1): rollouts generated ahead.

A thread of its own draws the prompts, samples and scores the groups (`rollout.collect_rollout`)
and scores the sampled tokens once more under the weights that sampled them (the sampler's
log-probs, for the loss's truncated importance sampling, `loss.importance_weights`), while the
trainer trains on an earlier batch. The generator decodes with a copy of the policy: parameters
that do not train (a LoRA run's base weights) are shared with the trainer's model, those that
train are its own, and after every optimiser step the trainer publishes their new values
(LoRA: the adapter only), which the generator copies in between two batches.

The schedule is fixed, as veRL's one-step-off pipeline is for K = 1: batch b (the one step b
trains on) is sampled by the policy after update max(v0, b - 1 - K), v0 being the update the run
started (or resumed) at. Its lag, in optimiser steps, is min(K, b - 1 - v0) in every run, so the
same spec and seed give the same metrics whatever the threads' timing; at most K batches wait in
the queue. A checkpoint after step s holds the prompt cursor and the sampling generator's state
as they were after batch s was drawn; a resumed run samples batches s + 1, ... again from there,
with the saved policy (lag 0 for its first batch): the same prompts, in the same order.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from workers.grpo.rollout import Rollout
from workers.grpo.scoring import Scorer

Event = tuple[str, str, dict]


@dataclass
class AheadBatch:
    """One rollout made by the generator, with what the trainer needs to know of its making."""

    rollout: Rollout
    sampler_logprobs: Tensor  # (N, T) log pi_sampler of the sampled tokens, 0 after the end
    version: int  # the optimiser steps the sampling policy had taken
    events: list[Event] = field(default_factory=list)  # raised while making it, in order
    resume_state: dict[str, Any] = field(default_factory=dict)  # the cursor after drawing it


class SerializedScorer:
    """A scorer that scores one batch at a time across threads (the generator's training
    batches and the trainer's held-out evaluation may share verifiers and their processes)."""

    def __init__(self, inner: Scorer, lock: threading.Lock) -> None:
        self.inner, self.lock = inner, lock
        self.name, self.weight = inner.name, inner.weight

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        with self.lock:
            return self.inner.score(samples)


def generator_copy(model: Any, device: str | torch.device | None = None) -> Any:
    """The generator's model: a copy whose frozen parameters are the trainer's own tensors
    (read by both, written by neither) and whose trained parameters are copies. With a
    rollout `device` (`resources.rollout_devices`; on a CPU the CPU) a whole copy there."""
    if device is not None:
        return copy.deepcopy(model).to(device).eval()
    shared = {id(p): p for p in model.parameters() if not p.requires_grad}
    twin = copy.deepcopy(model, memo=dict(shared))
    return twin.eval()


def map_tensors(value: Any, fn: Callable[[Tensor], Tensor], depth: int = 0) -> Any:
    """`value` with `fn` applied to every tensor it holds (dataclasses, dicts, lists, tuples,
    a few levels deep). What holds no changed tensor is the same object (records are known
    by identity)."""
    if isinstance(value, Tensor):
        return fn(value)
    if depth > 4:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        old = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        new = {k: map_tensors(v, fn, depth + 1) for k, v in old.items()}
        same = all(new[k] is v for k, v in old.items())
        return value if same else dataclasses.replace(value, **new)
    if isinstance(value, dict):
        new_items = {k: map_tensors(v, fn, depth + 1) for k, v in value.items()}
        return value if all(new_items[k] is v for k, v in value.items()) else new_items
    if isinstance(value, list | tuple):
        new_list = [map_tensors(v, fn, depth + 1) for v in value]
        same = all(a is b for a, b in zip(new_list, value, strict=True))
        return value if same else type(value)(new_list)
    return value


def moved(value: Any, device: torch.device) -> Any:
    """A batch made on the rollout device, every tensor on the trainer's `device`."""
    return map_tensors(value, lambda t: t.to(device))


# Makes batch b (1-based) on the generator's thread: (on_event) -> (rollout, sampler log-probs,
# the cursor after drawing it).
MakeBatch = Callable[[Callable[[str, str, dict], None]], tuple[Rollout, Tensor, dict[str, Any]]]


class RolloutsAhead:
    """The generator thread, its queue of at most K batches, and the published weights.

    On a GPU the generator runs on a CUDA stream of its own, so that its kernels can run beside
    the trainer's instead of queueing behind them on the default stream. Hand-offs wait for the
    stream that made the tensors (a batch, published weights) and mark them used by the other,
    so that the allocator reuses no memory still being read.
    """

    def __init__(
        self,
        make_batch: MakeBatch,
        trained: list[Tensor],
        max_off_policy_steps: int,
        start: int,
        last_step: int,
        trainer_device: torch.device | None = None,
    ) -> None:
        """`trainer_device`: where the trainer reads the batches, when the generator's model
        is on another device (None: the same)."""
        self.make_batch, self.trained = make_batch, trained  # the generator's trained params
        self.trainer_device = trainer_device
        self.k, self.start, self.last = max_off_policy_steps, start, last_step
        self.version = start  # the updates the generator's weights hold
        self.published: dict[int, list[Tensor]] = {}
        self.queue: deque[AheadBatch] = deque()
        self.lock = threading.Condition()
        self.error: BaseException | None = None
        self.stopped = False
        self.resume_state: dict[str, Any] | None = None  # of the batch trained on last
        self.thread = threading.Thread(target=self._loop, name="grpo-rollouts", daemon=True)
        device = trained[0].device if trained else torch.device("cpu")
        # high priority: its few-row decode kernels run between the training kernels' blocks
        # rather than waiting for a long backward to drain
        self.stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None

    def needed_version(self, batch: int) -> int:
        return max(self.start, batch - 1 - self.k)

    def begin(self) -> None:
        self.thread.start()

    def next(self) -> AheadBatch:
        """The next batch, in order; blocks until it is made; raises the generator's error."""
        with self.lock:
            self.lock.wait_for(lambda: self.queue or self.error is not None)
            if self.error is not None:
                raise self.error
            batch = self.queue.popleft()
            self.lock.notify_all()
        self.resume_state = batch.resume_state
        if self.trainer_device is not None:  # made on the rollout device: copied over
            batch = moved(batch, self.trainer_device)
            if self.trainer_device.type == "cuda":  # before the originals' memory is reused
                torch.cuda.current_stream(self.trainer_device).synchronize()
            return batch
        if self.stream is not None:  # made (and synchronised) on the generator's stream
            current = torch.cuda.current_stream(self.stream.device)

            def used_here(tensor: Tensor) -> Tensor:
                if tensor.is_cuda:
                    tensor.record_stream(current)
                return tensor

            map_tensors(batch, used_here)
        return batch

    def publish(self, version: int, params: Sequence[Tensor]) -> None:
        """The trainer's weights after `version` updates, if a batch still to come needs them."""
        if version > self.needed_version(self.last):
            return
        snapshot = [p.detach().clone() for p in params]
        if params and params[0].is_cuda:  # the generator's stream reads them once they are there
            torch.cuda.current_stream(params[0].device).synchronize()
        with self.lock:
            self.published[version] = snapshot
            self.lock.notify_all()

    def close(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify_all()
        if self.thread.is_alive():
            self.thread.join()

    def _loop(self) -> None:
        if self.stream is None:
            self._make_batches()
            return
        with torch.cuda.stream(self.stream):
            self._make_batches()

    def _make_batches(self) -> None:
        try:
            for batch in range(self.start + 1, self.last + 1):
                if not self._load_weights(self.needed_version(batch)):
                    return
                events: list[Event] = []
                rollout, sampler_lp, state = self.make_batch(lambda *e, to=events: to.append(e))
                if self.stream is not None:
                    self.stream.synchronize()  # the batch is there before the trainer reads it
                made = AheadBatch(rollout, sampler_lp, self.version, events, state)
                with self.lock:
                    self.lock.wait_for(lambda: self.stopped or len(self.queue) < self.k)
                    if self.stopped:
                        return
                    self.queue.append(made)
                    self.lock.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
            with self.lock:
                self.error = exc
                self.lock.notify_all()

    def _load_weights(self, version: int) -> bool:
        """Wait for the published weights of `version` and copy them in; False when stopped."""
        if version == self.version:
            return True
        with self.lock:
            self.lock.wait_for(lambda: self.stopped or version in self.published)
            if self.stopped:
                return False
            weights = self.published.pop(version)
            for old in [v for v in self.published if v < version]:
                del self.published[old]
        with torch.no_grad():
            for dst, src in zip(self.trained, weights, strict=True):
                dst.copy_(src)
        if self.stream is not None:
            self.stream.synchronize()  # copied before the snapshot's memory is freed
        self.version = version
        return True
