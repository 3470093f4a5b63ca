"""Padding saved by packed micro-batches (`grpo.micro_batch_tokens`) on a length-skewed batch.

    .venv/bin/python bench/packing.py [--size 3m] [--reps 5] [--tokens 512,1024] [--long 256]

One fixed batch of 4 prompts (16-48 tokens) x 8 completions, most of them short (8-32
tokens) and one in ten `--long` tokens (seeded, random tokens): the shape of a reasoning task
where a few completions run to max_new_tokens. Times the training forward + backward
(`update.accumulate_gradients`, the model's own forward) and pi_ref scoring of that batch in one
process, the layouts alternating rep by rep: padded as one batch, padded in micro-batches of 8
rows, and packed in micro-batches of at most `--tokens` tokens (each budget given). Prints each
layout's `padding_fraction` and median seconds, and the fast backend's padded forward beside
them. On CPU a pack's attention is one masked product over the whole pack (SDPA with a
block-diagonal mask: the masked-out blocks are computed too), so smaller packs waste less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def skewed_batch(long: int, seed: int = 0):
    """A Generation of 32 completions: lengths 8-32, one in ten `long` (EOS-less, truncated)."""
    import torch

    from workers.grpo.sampling import Generation

    own = torch.Generator().manual_seed(seed)
    n, groups = 32, 4
    short = torch.randint(8, 33, (n,), generator=own)  # (N,)
    lengths = torch.where(torch.rand(n, generator=own) < 0.1, long, short)  # (N,)
    lengths[5] = long  # at least one long completion, whatever the draw
    mask = (torch.arange(long) < lengths[:, None]).float()  # (N, T)
    tokens = torch.randint(5, 90, (n, long), generator=own).masked_fill(mask == 0, 0)
    prompt_lengths = torch.randint(16, 49, (groups,), generator=own).repeat_interleave(8)  # (N,)
    width = int(prompt_lengths.max())
    prompt_mask = (torch.arange(width) >= width - prompt_lengths[:, None]).long()  # left padded
    prompts = torch.randint(5, 90, (groups, width), generator=own).repeat_interleave(8, 0)
    prompts = prompts * prompt_mask  # (N, P)
    return Generation(prompts, prompt_mask, tokens, mask, [""] * n, lengths == long,
                      lengths=lengths.tolist(), group_size=8)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="3m")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", default="512,1024", help="micro_batch_tokens of the packed runs")
    ap.add_argument("--long", type=int, default=256, help="length of the long completions")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import AutoModelForCausalLM

    from bench.vs_trl import build
    from workers.grpo.backend import ReferenceBackend
    from workers.grpo.config import GenerationParams, GRPOParams
    from workers.grpo.fast import FastBackend
    from workers.grpo.loss import loss_denominator
    from workers.grpo.update import accumulate_gradients, batch_logprobs

    out = skewed_batch(args.long)
    n, mask = len(out.texts), out.completion_mask
    gen = GenerationParams(max_new_tokens=args.long)
    base = {"prompts_per_step": 4, "group_size": 8, "beta": 0.04}
    layouts = {
        "padded": (GRPOParams(**base), ReferenceBackend()),
        "padded x8": (GRPOParams(**base, micro_batch_size=8), ReferenceBackend()),
        "fast padded": (GRPOParams(**base), FastBackend()),
    }
    for tokens in (int(t) for t in args.tokens.split(",")):
        packed = GRPOParams(**base, micro_batch_tokens=tokens)
        layouts[f"packed {tokens}"] = (packed, ReferenceBackend())
    times = {name: {"fwd_bwd": [], "reference": []} for name in layouts}
    fraction: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_pretrained(build(args.size, Path(tmp)))
        advantages = torch.linspace(-1, 1, n)
        denominator = loss_denominator(mask, "sequence_mean", args.long)
        for _ in range(args.reps + 1):  # the first rep warms up, not counted
            for name, (g, backend) in layouts.items():
                start = time.perf_counter()
                ref = batch_logprobs(model, out, 1.0, g.micro_batch_size, backend=backend,
                                     micro_batch_tokens=g.micro_batch_tokens)  # fmt: skip
                times[name]["reference"].append(time.perf_counter() - start)
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                stats = accumulate_gradients(
                    model, out, mask, advantages, None, ref, g, gen, denominator, False,
                    backend=backend,
                )  # fmt: skip
                times[name]["fwd_bwd"].append(time.perf_counter() - start)
                fraction[name] = float(stats["padding_fraction"])
    real = int(out.prompt_mask.sum() + mask.sum())
    print(f"batch: {n} sequences, {real} tokens, completions {sorted(out.lengths)}")
    print(f"{'layout':>12}  padding_fraction  fwd+bwd s  pi_ref s")
    for name, t in times.items():
        fwd, ref = statistics.median(t["fwd_bwd"][1:]), statistics.median(t["reference"][1:])
        print(f"{name:>12}  {fraction[name]:16.3f}  {fwd:9.3f}  {ref:8.3f}")


if __name__ == "__main__":
    main()
