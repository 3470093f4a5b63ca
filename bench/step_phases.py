"""Where one step of this engine spends its time, and the same against another revision.

    .venv/bin/python bench/step_phases.py [--size 3m] [--steps 12]
    .venv/bin/python bench/step_phases.py --against HEAD~3 [--pairs 3] [--size 25m]

Trains the `vs_trl.py` job on the benchmark model for `--steps` steps and prints the median
seconds of each phase over the steps after the first two: generation, reference scoring, the
policy's forward + backward, gradient clipping, the optimizer step, and the whole step. With
`--against REV`, checks REV out into a temporary worktree and runs REV and this tree
alternately, `--pairs` times each, each run in its own process: on these shared machines the
whole machine's speed drifts between minutes, so compare pairs, not single runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("generation", "reference", "fwd_bwd", "clip", "optimizer", "step")


def _timed(record: list[float], fn: Callable) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - start)

    return call


def measure(root: Path, size: str, steps: int) -> dict[str, float]:
    """Median seconds per phase of the engine checked out at `root` (imported from there)."""
    sys.path.insert(0, str(root))
    warnings.filterwarnings("ignore", message=".*optimizer.step.*")  # we wrap it after LambdaLR
    import torch

    import workers.grpo.trainer as trainer
    from bench import runners
    from bench.vs_trl import build

    times: dict[str, list[float]] = {name: [] for name in PHASES}
    trainer.batch_logprobs = _timed(times["reference"], trainer.batch_logprobs)
    trainer.accumulate_gradients = _timed(times["fwd_bwd"], trainer.accumulate_gradients)
    trainer.grpo_step = _timed(times["step"], trainer.grpo_step)
    torch.nn.utils.clip_grad_norm_ = _timed(times["clip"], torch.nn.utils.clip_grad_norm_)
    setup = trainer._setup

    def timed_setup(*args: Any, **kwargs: Any) -> Any:
        run = setup(*args, **kwargs)
        run.sampler.generate = _timed(times["generation"], run.sampler.generate)
        run.optimizer.step = _timed(times["optimizer"], run.optimizer.step)
        return run

    trainer._setup = timed_setup
    with tempfile.TemporaryDirectory() as tmp:
        runners.run_ours(str(build(size, Path(tmp))), runners.Settings(steps=steps))
    return {k: statistics.median(v[2:] or v) for k, v in times.items() if v}


def _line(label: str, m: dict[str, float]) -> str:
    return f"{label:>10}  " + "  ".join(f"{k} {m[k] * 1e3:7.1f}" for k in PHASES if k in m)


def _run(root: Path, size: str, steps: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--root", str(root), "--size", size, "--steps", str(steps)]
    cmd.append("--json")
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="3m", choices=["3m", "25m"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--against", help="a git revision to compare with, run for run")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.against:
        m = measure(a.root, a.size, a.steps)
        print(json.dumps(m) if a.json else f"{a.size}, median ms per step:\n{_line('this', m)}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), a.against], cwd=ROOT)
        try:
            print(f"{a.size}, median ms per step; {a.against} and this tree alternately:")
            for _ in range(a.pairs):
                for label, root in ((a.against, base), ("this", ROOT)):
                    print(_line(label[:10], _run(root, a.size, a.steps)), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)


if __name__ == "__main__":
    main()
