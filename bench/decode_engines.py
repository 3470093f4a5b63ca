"""Decode tokens/s of each engine's sampler beside the memory-bandwidth bound of the device.

    python bench/decode_engines.py --size 1.5b --device cuda [--batch 64] [--new-tokens 128]

Builds the random-init model of `vs_trl.SIZES[size]` in bf16 (on CUDA; fp32 on a CPU dry run),
then for each engine (reference, fast, fast-graph = fast without its compiled layers, fast-eager =
fast without CUDA graphs, paged) samples
`batch` rows (batch / 8 prompts x 8) of exactly `new-tokens` tokens (EOS masked out, so every
row decodes to the end) through `backend.sampler(...).generate`, once to warm up and `--reps`
times timed. Tokens/s = rows x new tokens / seconds (prefill included: prompts are 16 tokens).

The bound: a decode step reads every weight once and the KV cache of every row at least once,
so tokens/s <= rows x bandwidth / (weight bytes + KV bytes at the mean context). Bandwidth is
`--bandwidth` GB/s, else the card's datasheet figure by name (H200 4800, H100 3350, A100 2039).
An engine that fails prints its error and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATASHEET_GBPS = {"H200": 4800, "H100": 3350, "A100": 2039, "L40S": 864, "A10": 600}
PROMPT = "Digit 7: 777 and digits"  # 23 characters, one token each (+ <bos>)


def bandwidth_gbps(device: str, given: float | None) -> float | None:
    import torch

    if given is not None:
        return given
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in DATASHEET_GBPS.items() if k in name), None)


def bound_tokens_per_s(model, rows: int, context: float, gbps: float) -> dict:
    """Weight + KV bytes read per decode step at the mean context, and the tokens/s bound."""
    c = model.config
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * size  # tied embedding counted once
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * size
    kv = rows * context * kv_per_token
    step_s = (weights + kv) / (gbps * 1e9)
    return {"weight_gb": weights / 1e9, "kv_gb": kv / 1e9, "bound_tok_s": rows / step_s}


def time_engine(
    name: str, model, tokenizer, rows: int, new_tokens: int, reps: int
) -> tuple[float, tuple[float, float]]:
    """Tokens/s of the engine's best rep, and how far its log-probs are from the model's own
    forward's (max, mean |difference|) over one more batch it samples."""
    import torch

    from workers.grpo.backend import select_backend
    from workers.grpo.config import GenerationParams, GRPOParams

    # paged-graphs: the paged engine with transformers' CUDA graphs (GRPO_PAGED_CUDA_GRAPHS=1)
    os.environ["GRPO_PAGED_CUDA_GRAPHS"] = "1" if name == "paged-graphs" else "0"
    # fast-eager: the fast engine without its CUDA graphs (GRPO_CUDA_GRAPHS=0)
    os.environ["GRPO_CUDA_GRAPHS"] = "0" if name == "fast-eager" else "1"
    # fast-graph: the fast engine's CUDA graphs without its compiled layers (GRPO_COMPILE_DECODE=0)
    os.environ["GRPO_COMPILE_DECODE"] = "0" if name == "fast-graph" else "1"
    name = name.removesuffix("-graphs").removesuffix("-eager").removesuffix("-graph")
    backend = select_backend(model, GRPOParams(engine=name, group_size=8))
    if backend.name != name:
        raise RuntimeError(f"{name} does not run this model here (got {backend.name})")
    backend.prepare(model)
    sampler = backend.sampler(model, tokenizer, torch.Generator().manual_seed(0))
    params = GenerationParams(max_new_tokens=new_tokens)
    prompts = [f"{PROMPT} {i}" for i in range(rows // 8)]
    sampler.generate(prompts, 8, params)  # warm-up: allocations, paged cache, CUDA graphs
    seconds = []
    for _ in range(reps):
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = sampler.generate(prompts, 8, params)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    decoded = sum(out.lengths or [])
    if decoded != rows * new_tokens:
        raise RuntimeError(f"decoded {decoded} tokens, expected {rows * new_tokens}")
    return rows * new_tokens / min(seconds), logprob_error(model, sampler, prompts, params)


def logprob_error(model, sampler, prompts: list[str], params) -> tuple[float, float]:
    """Max and mean |sampler's log-prob - the model's own forward's| of the sampled tokens.
    (Token-for-token comparisons between engines say little on a random-init model: its
    next-token distribution is nearly uniform over the vocabulary, so any rounding difference
    moves an inverse-CDF draw to a neighbouring token.)"""
    import torch

    from workers.grpo.logprobs import completion_logprobs

    out = sampler.generate(prompts, 8, params, keep_logprobs=True)
    if out.logprobs is None:
        return math.nan, math.nan
    with torch.no_grad():
        own, _ = completion_logprobs(
            model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask
        )
    diff = (out.logprobs.float() - own.float()).abs()[out.completion_mask.bool()]
    return float(diff.max()), float(diff.mean())


def decode_model(size: str, device: str):
    """The random-init model of `size` (bf16 on CUDA, else fp32) in eval mode, and its tokenizer,
    with EOS never sampled: every row decodes to the end. A bias on the LM head, not a forward
    hook: the fast engine's CUDA graphs map with the head's own weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.vs_trl import build

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        path = build(size, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    eos_bias = torch.zeros(model.config.vocab_size, dtype=dtype, device=device)
    eos_bias[tokenizer.eos_token_id] = -math.inf
    model.lm_head.bias = torch.nn.Parameter(eos_bias, requires_grad=False)
    return model, tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=64, help="rows (a multiple of 8)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--engines", default="reference,fast,fast-eager,paged")
    ap.add_argument("--bandwidth", type=float, help="GB/s (default: the card's datasheet)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import torch

    model, tokenizer = decode_model(a.size, a.device)
    dtype = model.dtype
    gbps = bandwidth_gbps(a.device, a.bandwidth)
    context = len(PROMPT) + 3 + a.new_tokens / 2
    bound = bound_tokens_per_s(model, a.batch, context, gbps) if gbps else None
    limit = (
        ""
        if bound is None
        else (
            f"; bound at {gbps:.0f} GB/s: weights {bound['weight_gb']:.2f} GB + KV "
            f"{bound['kv_gb']:.3f} GB a step -> {bound['bound_tok_s']:.0f} tok/s"
        )
    )
    print(f"== decode {a.size} on {a.device} ({dtype}), {a.batch} rows x {a.new_tokens} tokens"
          + limit, flush=True)  # fmt: skip
    results = {"size": a.size, "device": a.device, "rows": a.batch, "new_tokens": a.new_tokens,
               "bandwidth_gbps": gbps, "bound": bound, "engines": {}}  # fmt: skip
    for name in a.engines.split(","):
        try:
            tok_s, (worst, mean) = time_engine(
                name, model, tokenizer, a.batch, a.new_tokens, a.reps
            )
        except Exception as exc:  # noqa: BLE001 - report and go on to the next engine
            print(f"  {name:10} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            results["engines"][name] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
            continue
        share = f" = {100 * tok_s / bound['bound_tok_s']:.1f}% of the bound" if bound else ""
        print(f"  {name:10} {tok_s:10.0f} tok/s{share}; log-probs vs the model's forward: max "
              f"{worst:.4f}, mean {mean:.4f}", flush=True)  # fmt: skip
        results["engines"][name] = {"tok_s": tok_s, "logprob_error": [worst, mean]} | (
            {"share_of_bound": tok_s / bound["bound_tok_s"]} if bound else {}
        )
        if a.device == "cuda":
            torch.cuda.empty_cache()
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
