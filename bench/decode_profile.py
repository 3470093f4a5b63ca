"""Where a decode step's time goes in the fast engine on a GPU (issue 33).

    python bench/decode_profile.py --size qwen2-0.5b [--batch 64] [--new-tokens 128]

On the random-init model of `--size` (bf16, EOS never sampled; `decode_engines.decode_model`):
  1. ms per token of a whole `generate` (prefill, sampling, the decode loop);
  2. ms per decode step of the model alone: `graph_decode.StaticStep.step` replayed
     `--new-tokens` times (compiled layers and eager layers);
  3. ms per token of the sampling alone (`draw.draw` on logits of the batch's shape),
     eager and through `torch.compile`;
  4. `torch.profiler` over one `generate`: GPU kernels per token and the kernels taking the most
     GPU time.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, reps: int) -> float:
    """Seconds of `reps` calls of fn, the device synchronised before and after."""
    _sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="qwen2-0.5b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    a = ap.parse_args()

    from bench.decode_engines import PROMPT, decode_model
    from workers.grpo.config import GenerationParams
    from workers.grpo.draw import draw
    from workers.grpo.fast import graph_decode
    from workers.grpo.fast.lean_decode import LeanDecoder
    from workers.grpo.fast.sampling import FastSampler
    from workers.grpo.sampling import settings_of
    from workers.grpo.text import encode_groups

    model, tokenizer = decode_model(a.size, a.device)
    n, steps = a.batch, a.new_tokens
    prompts = [f"{PROMPT} {i}" for i in range(n // 8)]
    params = GenerationParams(max_new_tokens=steps)
    sampler = FastSampler(model, tokenizer, torch.Generator().manual_seed(0))
    sampler.generate(prompts, 8, params)  # compile, capture
    whole = _timed(lambda: sampler.generate(prompts, 8, params), 2) / 2
    print(f"== {a.size}, {n} rows x {steps} tokens")
    print(f"  generate: {1e3 * whole / steps:.3f} ms a token ({n * steps / whole:.0f} tok/s)")

    ids, mask = encode_groups(tokenizer, prompts, 8, model.device)
    tokens = torch.zeros(n, dtype=torch.long, device=model.device)
    for compiled in (True, False):
        with torch.inference_mode():
            decoder = LeanDecoder.build(model, ids.shape[1] + steps + 2, rows=n)
            decoder.prefill(ids, mask, steps + 2, share=False)
            step = graph_decode.StaticStep(decoder, capture=a.device == "cuda", compiled=compiled)
            seconds = _timed(lambda s=step: s.step(tokens), steps)
        label = "compiled layers" if compiled else "eager layers"
        print(f"  model step alone, {label}: {1e3 * seconds / steps:.3f} ms")

    logits = torch.randn(n, model.config.vocab_size, device=model.device, dtype=model.dtype)
    noise = torch.rand(n, device=model.device)
    rows = settings_of(params, n, model.device)
    with torch.inference_mode():
        seconds = _timed(lambda: draw(logits, rows, noise, True), steps)
    print(f"  draw alone: {1e3 * seconds / steps:.3f} ms")
    compiled_sample = torch.compile(draw, fullgraph=True)
    try:
        with torch.inference_mode():
            compiled_sample(logits, rows, noise, True)
            seconds = _timed(lambda: compiled_sample(logits, rows, noise, True), steps)
        print(f"  draw compiled, alone: {1e3 * seconds / steps:.3f} ms")
    except Exception as exc:  # noqa: BLE001 - report and go on
        print(f"  draw compiled: FAILED {type(exc).__name__}: {str(exc)[:200]}")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sampler.generate(prompts, 8, params)
        _sync()
    on_device = torch.autograd.DeviceType.CUDA if a.device == "cuda" else None
    kernels = [e for e in prof.events() if on_device is None or e.device_type == on_device]
    gpu_us = sum(e.device_time for e in kernels)
    print(f"  profiled generate: {len(kernels) / steps:.0f} kernels and "
          f"{gpu_us / 1e3 / steps:.3f} ms of GPU time a token")  # fmt: skip
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[: a.top]
    for name, times in ranked:
        print(f"    {100 * sum(times) / max(gpu_us, 1e-9):5.1f}%  {len(times) / steps:6.1f}/token  "
              f"{sum(times) / len(times):7.2f} us  {name[:110]}")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
