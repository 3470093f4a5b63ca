"""Where one step of this engine spends its time, and the same against another revision.

    .venv/bin/python bench/step_phases.py [--size 3m] [--steps 12]
    .venv/bin/python bench/step_phases.py --against HEAD~3 [--pairs 3] [--size 25m]
    .venv/bin/python bench/step_phases.py --ragged [--against REV] [--size 25m]
    .venv/bin/python bench/step_phases.py --lora 16 [--against REV] [--size 25m]

Trains the `vs_trl.py` job on the benchmark model for `--steps` steps and prints the median
seconds of each phase over the steps after the first two: generation, reference scoring, the
policy's forward + backward, gradient clipping, the optimizer step, and the whole step. With
`--against REV`, checks REV out into a temporary worktree and runs REV and this tree
alternately, `--pairs` times each, each run in its own process: on these shared machines the
whole machine's speed drifts between minutes, so compare pairs, not single runs.
With `--ragged`, times reference scoring and the policy's forward + backward (no replay) of
one fixed batch of 2 x 8 completions of ragged lengths (8 to 96 tokens, as on real tasks;
the benchmark job's completions nearly all run to their 32 tokens) instead of training.
With `--lora R`, the job trains a LoRA adapter of rank R (alpha 2R, all linear layers).
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


def timed(record: list[float], fn: Callable) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - start)

    return call


def measure(root: Path, size: str, steps: int, lora: int | None = None) -> dict[str, float]:
    """Median seconds per phase of the engine checked out at `root` (imported from there)."""
    sys.path.insert(0, str(root))
    warnings.filterwarnings("ignore", message=".*optimizer.step.*")  # we wrap it after LambdaLR
    import torch

    import workers.grpo.trainer as trainer
    from bench import runners
    from bench.vs_trl import build

    times: dict[str, list[float]] = {name: [] for name in PHASES}
    trainer.batch_logprobs = timed(times["reference"], trainer.batch_logprobs)
    trainer.accumulate_gradients = timed(times["fwd_bwd"], trainer.accumulate_gradients)
    trainer.grpo_step = timed(times["step"], trainer.grpo_step)
    torch.nn.utils.clip_grad_norm_ = timed(times["clip"], torch.nn.utils.clip_grad_norm_)
    # The run is built by `run.open_run` (older revisions: `trainer._setup`), called from train.
    setup_name = "open_run" if hasattr(trainer, "open_run") else "_setup"
    setup = getattr(trainer, setup_name)

    def timed_setup(*args: Any, **kwargs: Any) -> Any:
        run = setup(*args, **kwargs)
        run.sampler.generate = timed(times["generation"], run.sampler.generate)
        run.optimizer.step = timed(times["optimizer"], run.optimizer.step)
        return run

    setattr(trainer, setup_name, timed_setup)
    if lora is not None:  # through the spec, so that older revisions (--against) take it too
        import workers.grpo.config as config

        spec = config.TrainSpec
        adapter = {"r": lora, "alpha": 2 * lora}
        config.TrainSpec = lambda **kw: spec(**kw | {"lora": adapter})  # type: ignore[misc]
    with tempfile.TemporaryDirectory() as tmp:
        runners.run_ours(str(build(size, Path(tmp))), runners.Settings(steps=steps))
    return {k: statistics.median(v[2:] or v) for k, v in times.items() if v}


def measure_ragged(root: Path, size: str, reps: int) -> dict[str, float]:
    """Median seconds of pi_ref scoring and the policy's forward + backward of one batch of
    completions of lengths drawn from 8..96 (seeded), random tokens."""
    sys.path.insert(0, str(root))
    import torch
    from transformers import AutoModelForCausalLM

    from bench.vs_trl import build
    from workers.grpo.config import TrainSpec
    from workers.grpo.sampling import Generation
    from workers.grpo.update import accumulate_gradients, batch_logprobs

    n, width = 16, 96
    own = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, width + 1, (n,), generator=own)  # (N,)
    mask = (torch.arange(width) < lengths[:, None]).float()  # (N, T)
    tokens = torch.randint(5, 90, (n, width), generator=own).masked_fill(mask == 0, 0)
    prompts = torch.randint(5, 90, (2, 9), generator=own).repeat_interleave(8, 0)  # (N, P)
    out = Generation(prompts, torch.ones_like(prompts), tokens, mask, [""] * n,
                     torch.zeros(n, dtype=torch.bool), lengths=lengths.tolist())  # fmt: skip
    times: dict[str, list[float]] = {"reference": [], "fwd_bwd": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = build(size, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        spec = TrainSpec(
            base_model=str(path), grpo={"beta": 0.04}, generation={"max_new_tokens": width}
        )
        score = timed(times["reference"], batch_logprobs)
        train = timed(times["fwd_bwd"], accumulate_gradients)
        for _ in range(reps):
            ref = score(model, out, 1.0, None)
            model.zero_grad()
            advantages = torch.linspace(-1, 1, n)
            train(
                model,
                out,
                mask,
                advantages,
                None,
                ref,
                spec.grpo,
                spec.generation,
                mask.sum(),
                False,
            )
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def _line(label: str, m: dict[str, float]) -> str:
    return f"{label:>10}  " + "  ".join(f"{k} {m[k] * 1e3:7.1f}" for k in PHASES if k in m)


def _run(root: Path, size: str, steps: int, ragged: bool, lora: int | None) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--root", str(root), "--size", size, "--steps", str(steps)]
    cmd += ["--json", "--ragged"] if ragged else ["--json"]
    cmd += [] if lora is None else ["--lora", str(lora)]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="3m", choices=["3m", "25m"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--against", help="a git revision to compare with, run for run")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--ragged", action="store_true", help="one ragged batch, not training")
    ap.add_argument("--lora", type=int, metavar="R", help="train a LoRA adapter of rank R")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.against:
        if a.ragged:
            m = measure_ragged(a.root, a.size, 6)
        else:
            m = measure(a.root, a.size, a.steps, a.lora)
        print(json.dumps(m) if a.json else f"{a.size}, median ms per step:\n{_line('this', m)}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), a.against], cwd=ROOT)
        try:
            print(f"{a.size}, median ms per step; {a.against} and this tree alternately:")
            for _ in range(a.pairs):
                for label, root in ((a.against, base), ("this", ROOT)):
                    m = _run(root, a.size, a.steps, a.ragged, a.lora)
                    print(_line(label[:10], m), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)


if __name__ == "__main__":
    main()
