"""The one draw of every decoder: GRPO rollouts and evaluation (`sampling.PlainSampler`,
`fast.sampling.FastSampler`), Tinker's sampler (`workers.tinker.sampler`) and the inference
server (`workers.inference.decode`) pick each next token here.

Per row of a batch (`RowSettings`: one temperature, top-k and top-p per row, so one batch mixes
requests of different settings): logits / T, the top-k, the top-p (nucleus) mass, then the
token where the cumulative distribution reaches the row's own uniform (`inverse_cdf`). A row
whose temperature is below `GREEDY_BELOW` (0 included) takes the argmax.

A row's uniforms (`row_noise`, `seeded_noise`) come from a generator seeded by a base and the
row's index alone, one uniform per decode step: the same row draws the same tokens in whichever
batch, process or order it is decoded, so a batch split across N processes samples as one, and
a seeded request as when alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor

# Temperatures below this sample greedily (vLLM's floor): logits / T overflows float32 as T
# nears 0 (at 1e-45 every logit is infinite and softmax gives NaN), and below it the draw is
# the argmax anyway.
GREEDY_BELOW = 1e-5

# Odd 64-bit constant (the golden ratio's, as in splitmix64): row seeds far apart.
_ROW_STRIDE = 0x9E3779B97F4A7C15

# Vocabularies from this size on are drawn from in two levels (`inverse_cdf`): one scan over a
# large vocabulary and a few rows keeps a GPU mostly idle; on small ones (the CPU's tiny models)
# the one scan is fewer ops.
BLOCKED_DRAW_MIN_VOCAB = 16384
DRAW_BLOCK = 1024  # tokens per block of the two-level draw


@dataclass(frozen=True)
class RowSeeds:
    """A batch's noise named by its caller: `base` instead of a draw from the run's generator,
    and each row's index in the whole batch (instead of `first_row` + its position)."""

    base: int
    rows: list[int]

    def shifted(self, offset: int) -> RowSeeds:
        return RowSeeds(self.base, [offset + r for r in self.rows])


def draw_base(generator: torch.Generator) -> int:
    """One draw of the run's generator: the base of a batch's row seeds."""
    return int(torch.randint(2**62, (1,), generator=generator, device=generator.device))


def fresh_base() -> int:
    """A base for a request that names no seed: from the OS, never from torch's generator."""
    return int.from_bytes(os.urandom(8), "little") % 2**62


def _seeded(base: int, row: int) -> torch.Generator:
    return torch.Generator().manual_seed((base + _ROW_STRIDE * row) % 2**64)


def seeded_noise(rows: Sequence[tuple[int, int]], steps: int, device: torch.device) -> Tensor:
    """Uniforms (R, steps) in (0, 1]: row r's from a generator seeded by its (base, index) alone.
    A row's first s uniforms do not depend on `steps` (the CPU generator draws them in order)."""
    noise = torch.empty(len(rows), steps, dtype=torch.float64)  # (R, steps)
    for i, (base, row) in enumerate(rows):
        torch.rand(steps, generator=_seeded(base, row), dtype=torch.float64, out=noise[i])
    return (1.0 - noise).to(device, torch.float32)  # (R, steps) in (0, 1]


class NoiseStream:
    """`seeded_noise` drawn `chunk` steps at a time, for decodes whose length is known only as
    a cap (a request's max_tokens may be the whole context): the same uniforms, row by row."""

    def __init__(self, rows: Sequence[tuple[int, int]], chunk: int = 256) -> None:
        self.generators = [_seeded(base, row) for base, row in rows]
        self.chunk = chunk
        self.noise = torch.empty(len(rows), 0)  # (R, drawn)

    def step(self, t: int) -> Tensor:
        """Every row's uniform (R,) of decode step `t`."""
        while t >= self.noise.shape[1]:
            more = torch.empty(len(self.generators), self.chunk, dtype=torch.float64)
            for i, own in enumerate(self.generators):
                torch.rand(self.chunk, generator=own, dtype=torch.float64, out=more[i])
            self.noise = torch.cat([self.noise, (1.0 - more).float()], 1)  # (R, drawn + chunk)
        return self.noise[:, t]


def row_noise(
    generator: torch.Generator,
    first_row: int,
    rows: int,
    steps: int,
    device: torch.device,
    seeds: RowSeeds | None = None,
) -> Tensor:
    """Uniforms (rows, steps) in (0, 1], one per row and decode step. Row i's come from a
    generator seeded by one draw of `generator` and the row's index in the whole batch,
    `first_row + i`: the same row gets the same draws in whichever process samples it.
    With `seeds`, the base and the rows' indices are those (`generator` is not drawn)."""
    base = draw_base(generator) if seeds is None else seeds.base
    index = range(first_row, first_row + rows) if seeds is None else seeds.rows
    if len(index) != rows:
        raise ValueError(f"{len(index)} row seeds for {rows} rows")
    return seeded_noise([(base, row) for row in index], steps, device)  # (rows, steps)


@dataclass(frozen=True)
class RowSettings:
    """The sampling settings of each row of a batch: temperature, top_k (0: off) and top_p
    (1: off), as host tuples; what `draw` reads of them is derived once (cached), one number
    when every row has the same, else a tensor on the logits' device (mixed top-k reads its
    widest k back from the device)."""

    temperatures: tuple[float, ...]
    top_ks: tuple[int, ...]
    top_ps: tuple[float, ...]
    device: torch.device

    @classmethod
    def uniform(
        cls, temperature: float, top_k: int, top_p: float, rows: int, device: torch.device
    ) -> RowSettings:
        """Every one of `rows` rows sampled alike."""
        return cls((temperature,) * rows, (top_k,) * rows, (top_p,) * rows, torch.device(device))

    def select(self, rows: Sequence[int]) -> RowSettings:
        """The settings of `rows` (indices into this batch's rows), in that order."""
        t, k, p = self.temperatures, self.top_ks, self.top_ps
        return RowSettings(tuple(t[r] for r in rows), tuple(k[r] for r in rows),
                           tuple(p[r] for r in rows), self.device)  # fmt: skip

    @cached_property
    def greedy(self) -> list[bool]:
        """Which rows take the argmax (temperature below `GREEDY_BELOW`)."""
        return [t < GREEDY_BELOW for t in self.temperatures]

    @cached_property
    def greedy_rows(self) -> bool | Tensor:
        """False: no row is greedy; True: every row; else which rows (N,) bool."""
        if not any(self.greedy) or all(self.greedy):
            return any(self.greedy)
        return torch.tensor(self.greedy, device=self.device)

    @cached_property
    def scale(self) -> float | Tensor | None:
        """What the logits are divided by: one float, per-row (N, 1), or None (all 1); greedy
        rows' logits at T = 1."""
        temps = [1.0 if g else t for g, t in zip(self.greedy, self.temperatures, strict=True)]
        if len(set(temps)) == 1:
            return None if temps[0] == 1.0 else temps[0]
        return torch.tensor(temps, dtype=torch.float32, device=self.device).unsqueeze(1)

    @cached_property
    def top_k(self) -> int | Tensor:
        """The one top-k of every row, or per row (N,) (0: off)."""
        if len(set(self.top_ks)) == 1:
            return self.top_ks[0]
        return torch.tensor(self.top_ks, dtype=torch.long, device=self.device)

    @cached_property
    def top_p(self) -> float | Tensor:
        """The one top-p of every row, or per row (N, 1) (rows without one: 2, never reached)."""
        if len(set(self.top_ps)) == 1:
            return self.top_ps[0]
        ps = [p if p < 1.0 else 2.0 for p in self.top_ps]
        return torch.tensor(ps, dtype=torch.float32, device=self.device).unsqueeze(1)


def _top_k(logits: Tensor, top_k: int | Tensor) -> Tensor:
    """Logits (N, V) outside each row's top-k set to -inf (k 0 or at least V: none)."""
    v = logits.shape[-1]
    if isinstance(top_k, int):
        if top_k <= 0 or top_k >= v:
            return logits
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (N, 1)
        return logits.masked_fill(logits < kth, float("-inf"))  # (N, V)
    on = (top_k > 0) & (top_k < v)  # (N,) the rows that filter
    k = torch.where(on, top_k, 1)  # (N,)
    values = torch.topk(logits, int(k.max()), dim=-1).values  # (N, K) K: the widest k
    kth = values.gather(1, (k - 1).unsqueeze(1))  # (N, 1)
    kth = kth.masked_fill(~on.unsqueeze(1), float("-inf"))  # (N, 1) off: keeps every token
    return logits.masked_fill(logits < kth, float("-inf"))  # (N, V)


def _top_p(logits: Tensor, top_p: float | Tensor) -> Tensor:
    """Logits (N, V) outside each row's top-p mass set to -inf (the tokens, most likely first,
    after which the mass before them already reaches p)."""
    if isinstance(top_p, float) and top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (N, V)
    cum = sorted_logits.softmax(-1).cumsum(-1)  # (N, V)
    drop = cum - sorted_logits.softmax(-1) >= top_p  # (N, V) mass before it already >= p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))  # (N, V)
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)  # (N, V)


def filter_logits(logits: Tensor, top_k: int | Tensor, top_p: float | Tensor) -> Tensor:
    """Set logits (N, V) outside the top-k and outside the top-p mass to -inf; `top_k` and
    `top_p` one for every row, or per row (`RowSettings.top_k`, `RowSettings.top_p`)."""
    return _top_p(_top_k(logits, top_k), top_p)


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """The first token (N,) whose cumulative mass reaches u * the row's total, for probs (N, V)
    >= 0 and u (N,) in (0, 1]: always a token of mass > 0. From `BLOCKED_DRAW_MIN_VOCAB` tokens
    on, in two levels: the block of `DRAW_BLOCK` tokens where the mass is reached (a scan over
    the blocks' sums), then the token within it (a scan over that block alone)."""
    n, v = probs.shape
    if v < BLOCKED_DRAW_MIN_VOCAB:
        cum = probs.cumsum(-1)  # (N, V)
        target = u.unsqueeze(1) * cum[:, -1:]  # (N, 1)
        return torch.searchsorted(cum, target).squeeze(1).clamp_(max=v - 1)
    blocks = F.pad(probs, (0, -v % DRAW_BLOCK)).view(n, -1, DRAW_BLOCK)  # (N, K, B)
    ends = blocks.sum(-1).cumsum(-1)  # (N, K) the mass up to each block's end
    target = u.unsqueeze(1) * ends[:, -1:]  # (N, 1)
    block = torch.searchsorted(ends, target).clamp_(max=ends.shape[1] - 1)  # (N, 1)
    before = ends.gather(1, (block - 1).clamp(min=0)).masked_fill(block == 0, 0.0)  # (N, 1)
    inside = blocks.gather(1, block.unsqueeze(2).expand(n, 1, DRAW_BLOCK)).squeeze(1)  # (N, B)
    cum = inside.cumsum(-1) + before  # (N, B): `before` exactly up to the block's first mass
    # the block's own sum and its scan round differently: the target at most its scan's end
    j = torch.searchsorted(cum, torch.minimum(target, cum[:, -1:]))  # (N, 1)
    return (block * DRAW_BLOCK + j).squeeze(1)


@overload
def draw(
    logits: Tensor, rows: RowSettings, noise: Tensor, keep: Literal[True]
) -> tuple[Tensor, Tensor]: ...
@overload
def draw(
    logits: Tensor, rows: RowSettings, noise: Tensor, keep: bool = False
) -> tuple[Tensor, Tensor | None]: ...
def draw(
    logits: Tensor, rows: RowSettings, noise: Tensor, keep: bool = False
) -> tuple[Tensor, Tensor | None]:
    """One token (N,) per row from logits (N, V) with the row's uniform `noise` (N,) and its
    settings `rows`; with `keep` its log-prob (N,) under softmax(logits / T), before top-k and
    top-p (the policy's own distribution; greedy rows' at T = 1)."""
    logits = logits.float()  # (N, V)
    scale = rows.scale
    if scale is not None:
        logits = logits / scale  # (N, V)
    greedy = rows.greedy_rows
    if greedy is True:
        token = logits.argmax(-1)  # (N,)
    else:
        probs = filter_logits(logits, rows.top_k, rows.top_p).softmax(-1)  # (N, V)
        token = inverse_cdf(probs, noise)  # (N,)
        if greedy is not False:
            token = torch.where(greedy, logits.argmax(-1), token)  # (N,)
    if not keep:
        return token, None
    chosen = logits.gather(1, token.unsqueeze(1)).squeeze(1)  # (N,)
    return token, chosen - logits.logsumexp(-1)  # (N,) log pi(y_t) = logit - logsumexp
