"""Decode time when completions end at different steps: ended rows dropped vs decoded to the end.

    .venv/bin/python bench/ragged_decode.py [--size 25m] [--new-tokens 96] [--eos-bias 2.5]
        [--own-forward]

Generates 2 prompts x 8 completions with this engine's sampler (recording the decode for the
training forward's replay, as the trainer does) on the benchmark model (`vs_trl.SIZES`), whose
EOS logit is raised by `--eos-bias` so that completions end at ragged lengths as on real tasks
(the random-init model alone almost never ends one). Alternately with `sampling.RETIRE_AT` 0
(every row decoded until the last ends) and its default, prints the median milliseconds and
the rows fed over all steps. `--own-forward`: through the model's own forward and KV cache (as
models outside the lean path decode).
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
    ap.add_argument("--size", default="25m", choices=["3m", "25m"])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--eos-bias", type=float, default=2.5)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument(
        "--own-forward", action="store_true", help="decode through the model's own forward"
    )
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import workers.grpo.fast.sampling as sampling
    from bench.vs_trl import build
    from workers.grpo.config import GenerationParams
    from workers.grpo.fast.lean_decode import LeanDecoder

    default = sampling.RETIRE_AT
    fed: list[int] = []
    decoder = sampling._HFForward if a.own_forward else LeanDecoder
    real_step = decoder.step
    decoder.step = lambda self, tokens: fed.append(tokens.shape[0]) or real_step(self, tokens)
    with tempfile.TemporaryDirectory() as tmp:
        path = build(a.size, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
        bias = torch.zeros(model.config.vocab_size)
        bias[tokenizer.eos_token_id] = a.eos_bias
        model.lm_head.register_forward_hook(lambda _m, _i, out: out + bias)
        params = GenerationParams(max_new_tokens=a.new_tokens)
        prompts = ["Digit 3:", "Digit 8:"]
        times: dict[float, list[float]] = {0.0: [], default: []}
        rows: dict[float, list[int]] = {0.0: [], default: []}
        lengths = []
        for rep in range(a.reps):
            for retire_at in times:
                sampling.RETIRE_AT = retire_at
                own = torch.Generator().manual_seed(rep)
                lean = not a.own_forward
                sampler = sampling.FastSampler(model, tokenizer, own, lean=lean, record=True)
                fed.clear()
                start = time.perf_counter()
                out = sampler.generate(prompts, 8, params)
                times[retire_at].append(time.perf_counter() - start)
                rows[retire_at].append(sum(fed))
            lengths += out.lengths
        print(
            f"{a.size}, 2 prompts x 8 completions, at most {a.new_tokens} tokens; lengths "
            f"{min(lengths)}-{max(lengths)}, median {statistics.median(lengths):.0f}"
        )
        for retire_at, label in ((0.0, "every row to the end"), (default, "ended rows dropped")):
            ms = statistics.median(times[retire_at]) * 1e3
            print(f"  {label:22} {ms:8.1f} ms  rows fed {statistics.median(rows[retire_at]):6.0f}")


if __name__ == "__main__":
    main()
