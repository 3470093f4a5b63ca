"""Memory of many Tinker runs on one base model (issue 35): one LoraHost with N LoRA runs against
N separate copies of the model (N hosts of one run each), in one process each.

    .venv/bin/python bench/tinker_memory.py [--size 25m] [--runs 1,2,4] [--rank 16]

Each configuration runs in a fresh subprocess: load, create the runs (LoRA of rank R on every
linear layer and the unembedding, Tinker's default), one `forward_backward` (4 data of 64
tokens, cross_entropy) and one `optim_step` per run, so each run holds its adapter and its Adam
moments. Prints the process's RSS after imports and after that work (freed heap handed back
first: `malloc_trim`), medians of `--reps` processes, and each run's adapter + Adam bytes
(3 fp32 copies of its matrices).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _status_mib(key: str) -> float:
    if key == "VmRSS":  # what is live: freed heap handed back first (the step's activations)
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def child(mode: str, runs: int, model: Path, rank: int) -> dict:
    import torch

    from workers.tinker.host import LoraHost
    from workers.tinker.types import AdamParams, Datum, LoraConfig

    torch.set_num_threads(1)
    imported = _status_mib("VmRSS")
    state = Path(tempfile.mkdtemp())
    hosts = [
        LoraHost(model, state_dir=state / str(i)) for i in range(runs if mode == "copies" else 1)
    ]
    gen = torch.Generator().manual_seed(0)
    adapter_numel = 0
    for i in range(runs):
        host = hosts[i % len(hosts)]
        host.create_run(f"r{i}", LoraConfig(rank=rank, seed=i))
        ids = torch.randint(4, host.limits.vocab_size, (4, 65), generator=gen).tolist()
        data = [Datum(x[:-1], {"target_tokens": x[1:], "weights": [1.0] * 64}) for x in ids]
        host.forward_backward(f"r{i}", data, "cross_entropy")
        host.optim_step(f"r{i}", AdamParams(learning_rate=1e-3))
        adapter_numel = sum(p.numel() for p in host.adapters.parameters(host._runs[f"r{i}"].name))
    base_numel = sum(p.numel() for n, p in hosts[0].model.named_parameters() if "lora_" not in n)
    return {
        "mode": mode,
        "runs": runs,
        "imported_mib": imported,
        "rss_mib": _status_mib("VmRSS"),
        "peak_mib": _status_mib("VmHWM"),
        "base_mib": base_numel * 4 / 2**20,
        "per_run_state_mib": adapter_numel * 4 * 3 / 2**20,  # weights + Adam's two moments
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="25m")
    ap.add_argument("--runs", default="1,2,4")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3, help="processes per configuration (median)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "N"))
    ap.add_argument("--model", type=Path)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.model, args.rank)))
        return
    from bench.vs_trl import build

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build(args.size, Path(tmp))
        for n in (int(x) for x in args.runs.split(",")):
            for mode in ("shared", "copies") if n > 1 else ("shared",):
                cmd = [sys.executable, __file__, "--child", mode, str(n), "--model", str(model),
                       "--rank", str(args.rank)]  # fmt: skip
                reps = []
                for _ in range(args.reps):
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
                    reps.append(json.loads(out.stdout.strip().splitlines()[-1]))
                row = dict(reps[0])
                for key in ("imported_mib", "rss_mib", "peak_mib"):
                    row[key] = statistics.median(r[key] for r in reps)
                rows.append(row)
    first = rows[0]
    print(f"\nbase fp32 weights {first['base_mib']:.1f} MiB; one run's adapter + Adam "
          f"{first['per_run_state_mib']:.2f} MiB (rank {args.rank})")  # fmt: skip
    print("| runs | one base, N adapters: RSS (MiB) | N model copies: RSS (MiB) | over imports, "
          "one base | over imports, N copies | peak, one base | peak, copies |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in sorted({r["runs"] for r in rows}):
        shared = next(r for r in rows if r["runs"] == n and r["mode"] == "shared")
        copies = next((r for r in rows if r["runs"] == n and r["mode"] == "copies"), shared)
        print(f"| {n} | {shared['rss_mib']:.0f} | {copies['rss_mib']:.0f} | "
              f"{shared['rss_mib'] - shared['imported_mib']:.0f} | "
              f"{copies['rss_mib'] - copies['imported_mib']:.0f} | "
              f"{shared['peak_mib']:.0f} | {copies['peak_mib']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
