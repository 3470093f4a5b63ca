"""Decode time with the prompts' keys and values copied to every row vs kept once per group.

    .venv/bin/python bench/shared_prompts.py [--size 3m] [--new-tokens 32] [--reps 6]

Generates 2 prompts x 8 completions with this engine's sampler on the benchmark model
(`vs_trl.SIZES`), for prompts of 8 to 256 tokens, alternately with `lean_decode`'s prompt
sharing off and on, and prints the median milliseconds of each: where sharing starts to pay
sets `lean_decode.SHARE_MIN_PROMPT_BYTES`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="3m", choices=["3m", "25m"])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=6)
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import workers.grpo.fast.lean_decode as lean_decode
    from bench.vs_trl import build
    from workers.grpo.config import GenerationParams
    from workers.grpo.fast.sampling import FastSampler

    with tempfile.TemporaryDirectory() as tmp:
        path = build(a.size, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        sampler = FastSampler(model, AutoTokenizer.from_pretrained(path), torch.Generator())
        params = GenerationParams(max_new_tokens=a.new_tokens)
        print(f"{a.size}, 2 prompts x 8 completions x {a.new_tokens} tokens, median ms:")
        for length in (8, 16, 32, 64, 128, 256):
            prompts = [(f"Prompt {i}: " + "abcdefghij" * 26)[: length - 1] for i in range(2)]
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(a.reps):
                for share in times:
                    lean_decode.SHARE_MIN_PROMPT_BYTES = 0 if share else 2**62
                    start = time.perf_counter()
                    sampler.generate(prompts, 8, params)
                    times[share].append(time.perf_counter() - start)
            copied, shared = (statistics.median(times[k]) * 1e3 for k in (False, True))
            print(f"  prompt {length:3} tokens: copied {copied:7.1f}  shared {shared:7.1f}")


if __name__ == "__main__":
    main()
