"""The prompt stream: a seeded shuffle of the records, epoch after epoch, resumable by position."""

from __future__ import annotations

import torch


class PromptStream:
    """Yields record indices; the order of epoch e is a permutation seeded by (seed, e)."""

    def __init__(self, n_records: int, seed: int) -> None:
        if n_records < 1:
            raise ValueError("the training dataset has no records")
        self.n, self.seed, self.epoch, self.position = n_records, seed, 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=gen).tolist()

    def take(self, k: int) -> list[int]:
        """The next k indices, crossing into the next epoch (a new shuffle) when needed."""
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
