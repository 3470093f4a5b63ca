"""One GRPO step on N processes (torch.distributed): everything that differs from one process.

The step (`trainer.grpo_step`) is the same; it asks its `World` five things, which one process
(`Solo`) answers with the identity, so `--nproc 1` runs exactly the single-process code:

- `share`: the step's P prompts are split into N equal runs of whole groups (advantages are
  per group, so they stay local); each process draws the same P records from its replicated
  prompt stream and keeps its run. Its sampler gets the run's first row (`first_row`), so the
  per-row sampling randomness (`draw.row_noise`) is that of the same row in one process.
- `total`: the loss denominator over the whole batch (`loss.loss_denominator`): each process's
  loss is its part of the one-process loss, and the summed gradients are the one-process ones.
- `rollout`: decoding with whole weights. The model is FSDP2-sharded (`fully_shard`, one unit
  per decoder layer and the root); decoding one token at a time through sharded weights would
  gather every layer's weights at every token, and processes whose sequences end at different
  steps would wait for each other. So every unit is gathered once for the rollout (and the
  held-out evaluation) and resharded after it; each process then decodes on its own.
- `gather` / `metrics` / `pass_stats`: the step's figures over the whole batch, so every process
  logs the same numbers (process 0 writes them).
- `agree`: a stop or release decision taken by process 0 holds for every process.

Gradients are reduced by FSDP2 (reduce-scatter) as a sum (`set_gradient_divide_factor(1)`), not
its default mean: the global denominator already divides. With a factor, FSDP2 reduces with
`ReduceOp.PREMUL_SUM`, which gloo does not implement ("Cannot use ReduceOp.PREMUL_SUM with
Gloo"); `set_force_sum_reduction_for_comms(True)` makes it a plain SUM on every backend. The
gradient-norm clip and AdamW run on the shards (`clip_grad_norm_`'s norm is over all of them).
Left out: LoRA dropout > 0 draws its masks from each process's torch generator (results then
depend on the process count); DAPO's refill of zero-spread groups (`skip_zero_std_groups`) and
`lora.export_merged` are refused with N > 1 (`world.check_world`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from workers.grpo.config import GRPOParams
from workers.grpo.draw import RowSeeds
from workers.grpo.sampling import Generation, Sampler

_SUMMED = ("loss", "policy_loss")  # parts of the global loss: each process holds its part
SUMMED = ("resampled_groups", "scored_completions")  # counts of the whole batch
# `k + WEIGHT`: how many items the rollout metric k is the mean of (the episodes with a k-th
# turn reward, the tool calls): N processes weight their k by it; no step reports it.
WEIGHT = ":weight"


def without_weights(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.endswith(WEIGHT)}


class Solo:
    """One process: every answer is the identity (no collective, no copy)."""

    size, rank = 1, 0

    def local(self, grpo: GRPOParams) -> GRPOParams:
        return grpo

    def sampler(self, sampler: Sampler, group_size: int) -> Sampler:
        return sampler

    def share(self, indices: list[int]) -> list[int]:
        return indices

    def total(self, count: Any) -> Any:
        return count

    def gather(self, values: Tensor) -> Tensor:
        return values

    def metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return without_weights(metrics)

    def pass_stats(self, stats: dict[str, Any], *_: Tensor) -> dict[str, Any]:
        return stats

    def agree(self, flag: bool) -> bool:
        return flag

    def rollout(self, model: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class _ShardSampler:
    """A sampler whose rows start at this process's first row of the whole batch."""

    def __init__(self, inner: Sampler, first_row: int) -> None:
        self.inner, self.first_row = inner, first_row
        # Episodes' KV caches are this process's own rows: passed through as they are.
        self.continues = bool(getattr(inner, "continues", False))

    def generate(self, prompts: list, group_size: int, params: Any, keep_logprobs: bool = False,
                 first_row: int = 0, seeds: RowSeeds | None = None,
                 **cache: Any) -> Generation:  # fmt: skip
        if seeds is not None:  # rows named by the caller, in this process's run of the batch
            seeds = seeds.shifted(self.first_row)
        return self.inner.generate(
            prompts, group_size, params, keep_logprobs, first_row=self.first_row + first_row,
            **({} if seeds is None else {"seeds": seeds}), **cache,
        )  # fmt: skip


class Ranks:
    """This process in an initialised default process group of `size` processes."""

    def __init__(self, prompts_per_step: int) -> None:
        self.size, self.rank = dist.get_world_size(), dist.get_rank()
        self.per_rank = prompts_per_step // self.size  # whole groups: checked before launch

    def local(self, grpo: GRPOParams) -> GRPOParams:
        """This process's part of the step's batch: P / N prompts."""
        return grpo.model_copy(update={"prompts_per_step": self.per_rank})

    def sampler(self, sampler: Sampler, group_size: int) -> Sampler:
        # Evaluation uses the same sampler: every process decodes every held-out record (one
        # completion each, greedy), so there the rows start at 0 on every process.
        return _ShardSampler(sampler, self.rank * self.per_rank * group_size)

    def share(self, indices: list[int]) -> list[int]:
        """Of the step's drawn record indices (N runs of P / N), this process's run."""
        k = len(indices) // self.size
        return indices[self.rank * k : (self.rank + 1) * k]

    def total(self, count: Any) -> Any:
        """`count` added up over the processes (a tensor stays on its device, an int an int)."""
        if isinstance(count, Tensor):
            out = count.detach().clone()
            dist.all_reduce(out)
            return out
        out = torch.tensor(float(count), dtype=torch.float64)
        dist.all_reduce(out)
        return type(count)(out.item())

    def gather(self, values: Tensor) -> Tensor:
        """The whole batch's values (N * n,) from each process's (n,), in rank order."""
        flat = values.detach().to(torch.float64)  # gloo gathers no bool; float64 keeps ints
        parts = [torch.empty_like(flat) for _ in range(self.size)]
        dist.all_gather(parts, flat)
        return torch.cat(parts).to(values.dtype)

    def metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Rollout figures of the whole batch: counts add up, timings take the slowest
        process, means (over equal shares) average, means over unequal shares (a `WEIGHT`
        given) are weighted by them."""
        keys = sorted(metrics)
        weighted = {k for k in keys if k + WEIGHT in metrics}
        values = torch.tensor(
            [float(metrics[k]) * (metrics[k + WEIGHT] if k in weighted else 1.0) for k in keys],
            dtype=torch.float64,
        )
        summed, slowest = values.clone(), values.clone()
        dist.all_reduce(summed)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        total = dict(zip(keys, summed.tolist(), strict=True))
        out = {}
        for i, k in enumerate(keys):
            if k.endswith(WEIGHT):
                continue
            if k in weighted:
                out[k] = total[k] / total[k + WEIGHT] if total[k + WEIGHT] else 0.0
            elif k.startswith("errors/") or k.endswith("_tokens") or k in SUMMED:
                out[k] = summed[i].item()
            elif k.endswith("_seconds"):
                out[k] = slowest[i].item()
            else:
                out[k] = summed[i].item() / self.size
        return out

    def pass_stats(
        self, stats: dict[str, Any], loss_mask: Tensor, completion_mask: Tensor
    ) -> dict[str, Any]:
        """One optimisation pass's statistics over the whole batch: the loss parts add up, the
        per-token ones are weighted by each process's tokens, as one process weights them."""
        keys = sorted(stats)
        tokens, completion = loss_mask.sum().double(), completion_mask.sum().double()
        weight: dict[str, float | Tensor] = {
            "loss": 1.0,
            "policy_loss": 1.0,
            "grad_norm": 0.0,
            "entropy": completion,
        }
        row = [torch.as_tensor(_local(stats[k])).double() * weight.get(k, tokens) for k in keys]
        both = torch.stack([*row, tokens, completion])  # (K + 2,)
        dist.all_reduce(both)
        *sums, tokens_all, completion_all = both.unbind()
        out: dict[str, Any] = {}
        for k, s in zip(keys, sums, strict=True):
            if k == "grad_norm":  # the clip's norm is already over every shard
                out[k] = _local(stats[k])
            elif k in _SUMMED:
                out[k] = s
            else:
                out[k] = s / (completion_all if k == "entropy" else tokens_all).clamp(min=1)
        return out

    def agree(self, flag: bool) -> bool:
        """Process 0's decision, for every process (a stop seen by one alone would hang)."""
        out = torch.tensor([1.0 if flag else 0.0])
        dist.broadcast(out, src=0)
        return bool(out.item())

    @contextlib.contextmanager
    def rollout(self, model: Any) -> Iterator[None]:
        """Whole weights on every process while decoding; sharded again after."""
        units = fsdp_units(model)
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(True, recurse=False)


def _local(value: Any) -> Tensor:
    """A DTensor's full value (the clip's norm), any other value as it is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def fsdp_units(model: Any) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_model(model: Any) -> None:
    """FSDP2 over `model`: one unit per decoder layer (the model's `_no_split_modules`, as
    transformers names them), then the root (embeddings, final norm, head). Gradients summed."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = set(getattr(base, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)
    for unit in fsdp_units(model):
        unit.set_gradient_divide_factor(1.0)
        # a plain SUM: FSDP2 would otherwise reduce with PREMUL_SUM(1), which gloo lacks
        unit.set_force_sum_reduction_for_comms(True)


def world_of(grpo: GRPOParams) -> Solo | Ranks:
    """`Ranks` in a process group of more than one process, else `Solo`."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return Ranks(grpo.prompts_per_step)
    return Solo()
