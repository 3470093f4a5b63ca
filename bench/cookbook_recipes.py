"""tinker-cookbook's minimal recipes (`recipes/sl_loop.py`, `recipes/rl_loop.py`, tinker-cookbook
0.6.1, unchanged) against this server on the tiny model (CPU), as docs/tinker.md describes.

    PYTHONPATH=<tinker-cookbook and its extra deps> .venv/bin/python bench/cookbook_recipes.py \
        [--sl-steps 12] [--rl-steps 8]

Starts `grpo-service api` and `grpo-service tinker-worker` (bench/tinker_requests.py's `start`)
on a fresh SQLite data directory with the tiny model as catalog model `tiny`, then calls each
recipe's `main(Config(...))` in this process with `base_url` set to the server and
`TINKER_API_KEY=tml-<a key of ours>`. What the recipes would fetch from the internet is given
locally, without editing them:
- the tokenizer: `tokenizer_utils.register_tokenizer("tiny", ...)`, the tiny model's own;
- the renderer: the cookbook's generic `role_colon` (its model table knows only Hub names);
- the datasets (`datasets.load_dataset`): no_robots-shaped conversations for sl_loop, and
  gsm8k-shaped questions for rl_loop;
- rl_loop's reward: a random tiny model never writes `\\boxed{}`, so every group would score 0
  and every step be skipped; the reward here is the share of digits in the answer, which the
  samples vary in, so the recipe's importance-sampling steps run.
Prints each recipe's logged metrics by step and the checkpoints it saved.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tinker_requests import setup, start  # noqa: E402


def sl_rows(n: int) -> list[dict]:
    """Conversations in no_robots' shape: a fixed reply per kind of question, to be learned."""
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        messages = [
            {"role": "user", "content": f"add {a} and {b}"},
            {"role": "assistant", "content": f"{a} + {b} = {a + b}"},
        ]
        rows.append({"messages": messages, "prompt": messages[0]["content"]})
    return rows


def rl_rows(n: int) -> list[dict]:
    """Questions in gsm8k's shape (`#### <answer>` ends the answer)."""
    return [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}=2*{i}\n#### {2 * i}"}
            for i in range(n)]  # fmt: skip


def patch_cookbook(model_dir: Path) -> None:
    """The local tokenizer, renderer, datasets and reward (the module docstring says why)."""
    import datasets
    from tinker_cookbook import model_info, tokenizer_utils
    from tinker_cookbook.recipes import rl_loop
    from transformers import AutoTokenizer

    tokenizer_utils.register_tokenizer("tiny", lambda: AutoTokenizer.from_pretrained(model_dir))
    model_info.get_recommended_renderer_name = lambda name: "role_colon"

    def load_dataset(path: str, *args: object, **kwargs: object) -> datasets.DatasetDict:
        rows = sl_rows(256) if path == "HuggingFaceH4/no_robots" else rl_rows(64)
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})

    datasets.load_dataset = load_dataset
    rl_loop.get_reward = lambda response, answer: (
        sum(c.isdigit() for c in response) / max(1, len(response))
    )


def metrics(log_path: Path) -> list[dict]:
    lines = (log_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def report(name: str, log_path: Path, keys: tuple[str, ...]) -> None:
    rows = metrics(log_path)
    for key in keys:
        series = [row[key] for row in rows if key in row]
        print(f"{name} {key} by step: {' '.join(f'{v:.4g}' for v in series)}", flush=True)
    saved = (log_path / "checkpoints.jsonl").read_text().splitlines()
    print(f"{name} checkpoints: {[json.loads(s) for s in saved]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sl-steps", type=int, default=12)
    parser.add_argument("--rl-steps", type=int, default=8)
    args = parser.parse_args()
    from workers.grpo.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = make_tiny_model(Path(tmp) / "tiny", seed=0)
        port = 19000 + os.getpid() % 1000
        env, procs = start(Path(tmp) / "data", port)
        # On the way out (last in, first out): every process terminated, then each waited for.
        for p in procs:
            stack.callback(p.wait, 30)
        for p in procs:
            stack.callback(p.terminate)
        (key,) = setup(env, model, 1)
        os.environ["TINKER_API_KEY"] = f"tml-{key}"
        patch_cookbook(model)
        from tinker_cookbook.recipes import rl_loop, sl_loop

        base_url = f"http://127.0.0.1:{port}"
        sl_log = Path(tmp) / "sl"
        sl_loop.main(sl_loop.Config(
            base_url=base_url, log_path=str(sl_log), model_name="tiny", batch_size=16,
            learning_rate=1e-2, max_length=256, lora_rank=8, save_every=0,
            max_steps=args.sl_steps,
        ))  # fmt: skip
        report("sl_loop", sl_log, ("train_mean_nll", "train_mean_bpb", "time_total"))
        rl_log = Path(tmp) / "rl"
        rl_loop.main(rl_loop.Config(
            base_url=base_url, log_path=str(rl_log), model_name="tiny", batch_size=8,
            group_size=8, learning_rate=2e-2, lora_rank=8, save_every=0, max_tokens=16,
            loss_fn="importance_sampling", max_steps=args.rl_steps,
        ))  # fmt: skip
        report("rl_loop", rl_log, ("reward/total", "time/total"))


if __name__ == "__main__":
    main()
