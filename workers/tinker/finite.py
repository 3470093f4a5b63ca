"""Values that are not finite (NaN, Infinity) never leave the engine, nor stay in a run.

A Tinker result is JSON, and neither JSON nor PostgreSQL's json carries NaN or Infinity: a
pass, a step or a draw that produces one is refused with a `NotFinite` (the request fails with
a user error naming the field) and whatever it changed in the run is put back (`Snapshot`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from workers.tinker.types import TinkerInputError


class NotFinite(TinkerInputError):
    """A result or a state that would hold NaN or Infinity: the request is refused (JSON, and
    PostgreSQL's json, cannot carry such a value) and the run kept as it was."""


def finite(tensors: Sequence[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


class Snapshot:
    """Copies of an adapter's pending gradients (and, with its optimiser, its weights and Adam
    state), to undo a pass or a step that went non-finite. An adapter is small beside its base."""

    def __init__(
        self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        self.grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        self.weights = [p.detach().clone() for p in params] if optimizer is not None else None
        self.state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None

    def restore(
        self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        with torch.no_grad():
            for p, grad in zip(params, self.grads, strict=True):
                p.grad = grad
            for p, weight in zip(params, self.weights or [], strict=False):
                p.copy_(weight)
        if optimizer is not None and self.state is not None:
            optimizer.load_state_dict(self.state)
