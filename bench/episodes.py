"""Episode throughput against single-turn sampling on the same model: completion tokens / s.

    .venv/bin/python bench/episodes.py [--prompts 4] [--group 8] [--tokens 32] [--turns 2]
        [--repeats 3] [--engine fast|reference] [--device cpu|cuda] [--threads N] [--reencode]

Both sides sample through the job's sampler (`backend.select_backend`): single-turn is
`Sampler.generate` of `--prompts` x `--group` completions of `--turns` x `--tokens` tokens;
episodes are as many episodes of the "say it again" environment
(docs/examples/environments/say_it_again.py, told to ask again until `--turns` turns, in the
real sandboxed host), `--tokens` per turn, through `EpisodeRollout.play` (the training path:
the loop, the sandbox's steps, each turn's prefill, the template rendering between turns).
Both samplers continue each episode's KV cache across turns, prefilling only each turn's new
tokens; `--reencode` hides that from the episodes, which then re-encode every sequence each
turn (what a sampler without `continues` does). EOS is made
impossible so every turn is `--tokens` long and both sides sample the same number of tokens.
Prints the median tokens / s of each over `--repeats` runs and the ratio episodes / single.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Reencoding:
    """A sampler as one that cannot continue its cache: episodes re-encode every turn."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.generate(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", default="fast", choices=["fast", "reference"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--reencode", action="store_true")
    args = ap.parse_args()
    if args.turns < 2:
        ap.error("--turns: at least 2")
    os.environ["GRPO_ENGINE"] = args.engine

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.environments import EnvironmentConfig, SandboxedEnvironment
    from workers.grpo.backend import select_backend
    from workers.grpo.config import GenerationParams
    from workers.grpo.episode_rollout import EpisodeRollout
    from workers.grpo.tiny_model import make_tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    path = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny", chat_template=True)
    model = AutoModelForCausalLM.from_pretrained(path).to(args.device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    no_eos = torch.zeros(model.config.vocab_size, device=args.device)
    no_eos[tok.eos_token_id] = float("-inf")
    model.lm_head.register_forward_hook(lambda _m, _i, out: out + no_eos)
    backend = select_backend(model)
    backend.prepare(model)
    sampler = backend.sampler(model, tok, torch.Generator(args.device).manual_seed(0))
    records = [{"prompt": f"Digit {d}:", "digit": d} for d in range(args.prompts)]
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in records]
    single = GenerationParams(max_new_tokens=args.tokens * args.turns)
    per_turn = GenerationParams(max_new_tokens=args.tokens)
    source = Path(__file__).resolve().parents[1] / "docs/examples/environments/say_it_again.py"
    asks_once = "if len(turns) == 1:"
    assert asks_once in source.read_text(), "say_it_again.py changed: update the bench"
    environment = source.read_text().replace(asks_once, f"if len(turns) < {args.turns}:")
    episode_sampler = Reencoding(sampler) if args.reencode else sampler

    def run_single() -> float:
        out = sampler.generate(prompts, args.group, single)
        return out.completion_mask.sum().item()

    with SandboxedEnvironment(EnvironmentConfig(source=environment)) as env:
        rollout = EpisodeRollout(env, tok, args.turns, None, model.device)

        def run_episodes() -> float:
            _, scored, _ = rollout.play(records, episode_sampler, [], args.group, per_turn,
                                        False, lambda *_: None)  # fmt: skip
            return scored.metrics["completion_tokens"]

        rates = {"single-turn": [], "episodes": []}
        for _ in range(args.repeats + 1):  # the first round warms up (kernels, sandbox)
            for name, fn in (("single-turn", run_single), ("episodes", run_episodes)):
                t0 = time.perf_counter()
                tokens = fn()
                rates[name].append(tokens / (time.perf_counter() - t0))
    shape = f"{args.prompts} x {args.group}, {args.turns} x {args.tokens} tokens"
    continued = getattr(sampler, "continues", False) and not args.reencode
    turns = "continuing the cache" if continued else "re-encoded"
    print(f"backend {backend.name}, device {args.device}, {shape}, turns {turns}")
    med = {k: statistics.median(v[1:]) for k, v in rates.items()}
    for name, rate in med.items():
        print(f"{name:12s} {rate:10.1f} completion tokens/s")
    print(f"ratio episodes / single-turn: {med['episodes'] / med['single-turn']:.2f}")


if __name__ == "__main__":
    main()
