"""This GRPO engine against TRL's GRPOTrainer: same model, task, reward and settings.

    .venv/bin/python bench/vs_trl.py [--quick] [--sizes 3m,25m] [--reps N] [--steps 30]

For each model size (random-init, Llama-shaped, built locally), runs TRL and this engine
alternately (TRL first on even repetitions, ours first on odd ones; repetition k uses seed k
for both), each run in its own subprocess so that peak RSS is that run's. Prints per size:
median seconds per step, completion tokens per second (all tokens over all steps after the
first, whose time includes warm-up), peak RSS, mean reward over the last 5 steps, the machine's
load, and the ratios ours/TRL (medians over repetitions). `--threads N` gives both N torch
intra-op threads (default: torch's own, what a user gets); `--lora R` has both train a LoRA
adapter of rank R (alpha 2R, all linear layers) instead of all weights. Targets on a 2-core
CPU: >= 3x TRL's throughput at 3M, >= 1.5x at 25M, RSS <= TRL's, last-5 reward >= TRL's.
`--quick`: 3M only, 6 steps, one repetition (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> make_tiny_model(...) or Qwen2-shaped kwargs; parameter counts printed at build time.
SIZES = {
    "3m": {"hidden_size": 256, "layers": 4, "heads": 4, "intermediate_size": 512},
    "25m": {"hidden_size": 512, "layers": 8, "heads": 8, "intermediate_size": 1408},
    "0.5b": {"hidden_size": 1024, "layers": 24, "heads": 16, "intermediate_size": 4864},
    # Qwen2.5-0.5B's shape, random init, bf16 (bench/qwen2_model.py): 0.49B parameters
    "qwen2-0.5b": {"qwen2": True, "hidden_size": 896, "layers": 24, "heads": 14, "kv_heads": 2,
                   "intermediate_size": 4864, "vocab_size": 151936},
    # Qwen2.5-1.5B's shape, random init, bf16 (bench/qwen2_model.py): 1.54B parameters
    "1.5b": {"qwen2": True, "hidden_size": 1536, "layers": 28, "heads": 12, "kv_heads": 2,
             "intermediate_size": 8960, "vocab_size": 151936},
    # the same builder at toy scale: a CPU dry run of the 1.5b path
    "qwen2-3m": {"qwen2": True, "hidden_size": 256, "layers": 2, "heads": 4, "kv_heads": 2,
                 "intermediate_size": 512, "vocab_size": 4096},
}  # fmt: skip


DEFAULT_REPS = {"3m": 6}


def build(size: str, directory: Path) -> Path:
    import math

    from safetensors import safe_open

    from workers.grpo.tiny_model import make_tiny_model

    shape = dict(SIZES[size])
    if shape.pop("qwen2", False):
        from bench.qwen2_model import make_qwen2_model

        path = make_qwen2_model(directory / size, seed=0, **shape)
    else:
        path = make_tiny_model(directory / size, seed=0, **shape)
    with safe_open(path / "model.safetensors", "pt") as f:
        n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    print(f"model {size}: {n / 1e6:.1f}M parameters", flush=True)
    return path


def one_run(which: str, model_dir: Path, settings: dict) -> dict:
    code = (
        "import json, sys; from bench.runners import run; "
        "print('RESULT ' + json.dumps(run(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))"
    )
    cmd = [sys.executable, "-c", code, which, str(model_dir), json.dumps(settings)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"{which} run failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def figures(r: dict) -> dict:
    sec, tok = r["seconds"], r["tokens"]
    out = {
        "s_per_step": statistics.median(sec),
        "tok_per_s": sum(tok[1:]) / sum(sec[1:]) if len(sec) > 1 else tok[0] / sec[0],
        "rss_mib": r["rss_mib"],
        "reward_last5": statistics.fmean(r["rewards"][-5:]),
    }
    if r.get("gpu_mib") is not None:  # peak CUDA memory allocated (torch's counter)
        out["gpu_mib"] = r["gpu_mib"]
    return out


def _split(r: dict) -> str:
    """Our step's median generation / training seconds (TRL does not report them)."""
    if "split" not in r:
        return ""
    gen, train = (statistics.median(r["split"][k][1:] or r["split"][k]) for k in r["split"])
    return f", generation {gen:.3f} s + training {train:.3f} s"


def report(size: str, runs: dict[str, list[dict]]) -> dict:
    med = {
        w: {k: statistics.median(f[k] for f in map(figures, rs)) for k in figures(rs[0])}
        for w, rs in runs.items()
    }
    print(f"\n== {size} ({len(next(iter(runs.values())))} runs each; medians) ==")
    gpu = all("gpu_mib" in m for m in med.values())
    print(f"{'':14}{'s/step':>9}{'tok/s':>9}{'RSS MiB':>9}{'reward5':>9}" + " GPU peak MiB" * gpu)
    for w in med:
        m = med[w]
        print(
            f"{w:14}{m['s_per_step']:9.3f}{m['tok_per_s']:9.1f}"
            f"{m['rss_mib']:9.0f}{m['reward_last5']:9.3f}"
            + (f"{m['gpu_mib']:13.0f}" if gpu else "")
        )
    for w in (w for w in med if w.startswith("ours-k") and "ours" in med):
        print(f"{w + '/ours':14}step time x{med['ours']['s_per_step'] / med[w]['s_per_step']:.2f}"
              " faster than synchronous", flush=True)  # fmt: skip
    if "ours" not in med or "trl" not in med:
        return {"size": size} | med
    ours, trl = med["ours"], med["trl"]
    ratios = {
        "throughput": ours["tok_per_s"] / trl["tok_per_s"],
        "step_speedup": trl["s_per_step"] / ours["s_per_step"],
        "rss": ours["rss_mib"] / trl["rss_mib"],
        "reward_last5_diff": ours["reward_last5"] - trl["reward_last5"],
        **({"gpu_peak": ours["gpu_mib"] / trl["gpu_mib"]} if gpu else {}),
    }
    print(
        f"{'ours/TRL':14}throughput x{ratios['throughput']:.2f}, step time "
        f"x{ratios['step_speedup']:.2f} faster, RSS x{ratios['rss']:.2f}, "
        f"last-5 reward {ratios['reward_last5_diff']:+.3f}",
        flush=True,
    )
    return {"size": size, "trl": trl, "ours": ours, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3M only, 6 steps, 1 repetition")
    ap.add_argument("--sizes", default="3m,25m")
    ap.add_argument(
        "--reps",
        type=int,
        help="repetitions per size (default: 6 at 3M, 2 above: the last-5 "
        "reward of one 30-step run spreads over +-0.1, so the small model gets more seeds)",
    )
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    ap.add_argument("--vllm", action="store_true", help="TRL generates with vLLM (colocate)")
    ap.add_argument(
        "--threads", type=int, help="torch intra-op threads for both (default: torch's)"
    )
    ap.add_argument("--lora", type=int, metavar="R", help="both train a LoRA adapter of rank R")
    ap.add_argument("--only", choices=["ours", "trl"], help="run one side only")
    ap.add_argument("--engine", help="ours: grpo.engine (auto, fast, reference, paged)")
    ap.add_argument(
        "--off-policy",
        default="0",
        help="ours: comma-separated grpo.max_off_policy_steps, one run each (0 = synchronous)",
    )
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (x 8 completions)")
    ap.add_argument("--new-tokens", type=int, default=32, help="max_new_tokens")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    sizes, reps, steps = a.sizes.split(","), a.reps, a.steps
    if a.quick:
        sizes, reps, steps = ["3m"], 1, 6
    settings = {"steps": steps, "device": a.device, "bf16": a.bf16, "vllm": a.vllm}
    settings["threads"], settings["lora_r"] = a.threads, a.lora
    settings["engine"], settings["prompts_per_step"] = a.engine, a.prompts
    settings["max_new_tokens"] = a.new_tokens
    lags = [int(k) for k in a.off_policy.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            model_dir = build(size, Path(tmp))
            ours = {"ours" if k == 0 else f"ours-k{k}": k for k in lags}
            sides = ["trl"] * (a.only != "ours") + [*ours] * (a.only != "trl")
            runs: dict[str, list[dict]] = {w: [] for w in sides}
            for rep in range(reps or DEFAULT_REPS.get(size, 2)):
                for which in sides if rep % 2 == 0 else sides[::-1]:
                    lag = {"off_policy": ours[which]} if which in ours else {}
                    kind = "trl" if which == "trl" else "ours"
                    r = one_run(kind, model_dir, settings | {"seed": rep} | lag)
                    runs[which].append(r)
                    f = figures(r)
                    print(
                        f"  {size} rep {rep} {which:4}: {f['s_per_step']:.3f} s/step, "
                        f"{f['tok_per_s']:.1f} tok/s, {f['rss_mib']:.0f} MiB, "
                        f"reward5 {f['reward_last5']:.3f} (load {r['load']:.1f})"
                        + (f", GPU peak {r['gpu_mib']:.0f} MiB" if r.get("gpu_mib") else "")
                        + _split(r),
                        flush=True,
                    )
            results.append(report(size, runs))
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
