"""Off-policy steps against the synchronous step: the same model, task and settings, one process.

    .venv/bin/python bench/off_policy.py [--size 25m] [--steps 12] [--reps 2] [--k 1]

Builds the random-init model of `--size` (`vs_trl.SIZES`, built locally), then trains it on the
digit task (`runners.run_ours`) with `grpo.max_off_policy_steps` 0 and K alternately (0 first on
even repetitions, K first on odd ones), each run in its own subprocess. Prints per setting the
median seconds per step (after the first, whose time holds the warm-up and, with K >= 1, the
generator's first batch), the median generation and training seconds of a step (with K >= 1 the
generation runs on its own thread, beside the training), peak RSS, the last-5 mean reward, and
the ratio synchronous / off-policy of the seconds per step: above 1 the overlap pays.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vs_trl import build, one_run  # noqa: E402


def step_seconds(result: dict) -> float:
    return statistics.median(result["seconds"][1:] or result["seconds"])


def summary(runs: list[dict]) -> dict[str, float]:
    split = {
        k: statistics.median(v for r in runs for v in r["split"][k][1:]) for k in runs[0]["split"]
    }
    return {
        "s_per_step": statistics.median(step_seconds(r) for r in runs),
        "generation_s": split["generation"],
        "training_s": split["training"],
        "rss_mib": max(r["rss_mib"] for r in runs),
        "reward_last5": statistics.fmean(statistics.fmean(r["rewards"][-5:]) for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="25m")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--k", type=int, default=1, help="grpo.max_off_policy_steps of the async run")
    ap.add_argument("--new-tokens", type=int, default=32, help="max_new_tokens")
    ap.add_argument("--lora", type=int, default=None, help="train a LoRA adapter of this rank")
    a = ap.parse_args()
    settings = {"steps": a.steps, "max_new_tokens": a.new_tokens, "lora_r": a.lora}
    with tempfile.TemporaryDirectory() as tmp:
        model = build(a.size, Path(tmp))
        runs: dict[int, list[dict]] = {0: [], a.k: []}
        for rep in range(a.reps):
            order = (0, a.k) if rep % 2 == 0 else (a.k, 0)
            for k in order:
                runs[k].append(one_run("ours", model, settings | {"off_policy": k, "seed": rep}))
    sync, ahead = summary(runs[0]), summary(runs[a.k])
    for name, row in (("synchronous (K=0)", sync), (f"off-policy (K={a.k})", ahead)):
        print(
            f"{name:>20}: {row['s_per_step']:.3f} s/step (generation {row['generation_s']:.3f} s,"
            f" training {row['training_s']:.3f} s), RSS {row['rss_mib']:.0f} MiB,"
            f" last-5 reward {row['reward_last5']:.3f}"
        )
    print(f"speed-up synchronous / off-policy: {sync['s_per_step'] / ahead['s_per_step']:.2f}x")


if __name__ == "__main__":
    main()
