"""How fast could this engine's step be if only its heavy kernels took time? (a bound, not a test)

    .venv/bin/python bench/kernel_floor.py [--sizes 3m,25m] [--steps 8] [--reps 5] [--no-trl]

For each benchmark model (`vs_trl.SIZES`), trains a few steps of the `vs_trl.py` job with this
engine while a dispatch mode records, in one step, every matrix product (mm, addmm, bmm, oneDNN's
linear) and every attention kernel (forward and backward) with the tensors it ran on. Then it
runs exactly those kernel calls again, back to back on the same tensors, and prints their time by
phase (decode, reference scoring, policy forward + backward) beside the engine's measured step
and, unless `--no-trl`, TRL's (one run of `runners.run_trl` in a subprocess, as `vs_trl.py`).

TRL's step divided by the kernels' time is the most any engine that computes these products
with these kernels can gain over TRL: everything else (sampling, norms, RoPE, the loss, the
optimizer, Python) taken as free. The products are what the GRPO step must compute: G
completions decoded token by token, one reference forward, one policy forward and backward.
A second, looser bound takes the kernels as perfect too: the products' floating-point work
at this machine's best matrix-product rate (a 2048 x 2048 fp32 product, timed in the same run),
attention left out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from bench import runners  # noqa: E402
from bench.vs_trl import build, one_run  # noqa: E402

aten = torch.ops.aten
# In inference mode the dispatch mode sees composite ops (linear, scaled_dot_product_attention)
# before they decompose; with autograd it sees what they decompose into.
PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
PRODUCTS |= {aten.linear.default, aten.matmul.default}
ATTENTION = {
    aten.scaled_dot_product_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_backward.default,
}
if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
    PRODUCTS.add(torch.ops.mkldnn._linear_pointwise.default)
PHASES = {  # trainer function -> phase its kernels count in
    "collect_rollout": "decode",
    "batch_logprobs": "reference",
    "accumulate_gradients": "policy fwd+bwd",
}


class KernelRecorder(TorchDispatchMode):
    """Keeps (phase, op, args, kwargs) of every product / attention call while `phase` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.phase: str | None = None
        self.calls: list[tuple[str, Any, tuple, dict]] = []
        self.flops = 0.0  # of the products recorded

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.phase is not None and (func in PRODUCTS or func in ATTENTION):
            self.calls.append((self.phase, func, args, kwargs))
            if func in PRODUCTS:
                self.flops += product_flops(func, args, out)
        return out


def product_flops(func: Any, args: tuple, out: torch.Tensor) -> float:
    """2 x outputs x contracted length: the input's last dim (the second operand's for the
    add-forms addmm / baddbmm, whose first is the bias)."""
    operand = args[1] if func in (aten.addmm.default, aten.baddbmm.default) else args[0]
    return 2.0 * out.numel() * operand.shape[-1]


def best_product_rate(reps: int = 10) -> float:
    """FLOP/s of a 2048 x 2048 fp32 matrix product on torch's threads, best of `reps`."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    seconds = []
    for _ in range(reps + 2):
        start = time.perf_counter()
        torch.mm(a, b)
        seconds.append(time.perf_counter() - start)
    return 2.0 * 2048**3 / min(seconds[2:])


def record_one_step(model_dir: Path, steps: int) -> tuple[list, float, list[float]]:
    """Kernel calls of the last step of a `steps`-step run, their products' FLOPs, and the
    run's step seconds."""
    import workers.grpo.trainer as trainer

    recorder, step_no = KernelRecorder(), {"n": 0}
    originals = {name: getattr(trainer, name) for name in [*PHASES, "grpo_step"]}

    def in_phase(name: str):  # noqa: ANN202
        def call(*args: Any, **kwargs: Any) -> Any:
            recording = step_no["n"] == steps
            recorder.phase = PHASES[name] if recording else None
            try:
                if recording:
                    with recorder:
                        return originals[name](*args, **kwargs)
                return originals[name](*args, **kwargs)
            finally:
                recorder.phase = None

        return call

    def counted_step(*args: Any, **kwargs: Any) -> Any:
        step_no["n"] += 1
        return originals["grpo_step"](*args, **kwargs)

    for name in PHASES:
        setattr(trainer, name, in_phase(name))
    trainer.grpo_step = counted_step
    try:
        result = runners.run_ours(str(model_dir), runners.Settings(steps=steps))
    finally:
        for name, fn in originals.items():
            setattr(trainer, name, fn)
    # The recorded step ran with the dispatch mode's overhead: report the others' median.
    return recorder.calls, recorder.flops, result["seconds"][1:-1]


def replay_seconds(calls: list, reps: int) -> dict[str, float]:
    """Median over `reps` of each phase's kernel calls run back to back."""
    per_phase: dict[str, list[float]] = defaultdict(list)
    with torch.inference_mode():
        for _ in range(reps):
            totals: dict[str, float] = defaultdict(float)
            for phase, func, args, kwargs in calls:
                start = time.perf_counter()
                func(*args, **kwargs)
                totals[phase] += time.perf_counter() - start
            for phase, seconds in totals.items():
                per_phase[phase].append(seconds)
    return {phase: statistics.median(v) for phase, v in per_phase.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="3m,25m")
    ap.add_argument("--steps", type=int, default=8, help="steps run; the last is recorded")
    ap.add_argument("--reps", type=int, default=5, help="replays of the recorded kernels")
    ap.add_argument("--no-trl", action="store_true", help="do not run TRL for its step time")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes.split(","):
            model_dir = build(size, Path(tmp))
            calls, flops, seconds = record_one_step(model_dir, a.steps)
            phases = replay_seconds(calls, a.reps)
            kernels, ours = sum(phases.values()), statistics.median(seconds)
            rate = best_product_rate()
            split = ", ".join(f"{p} {s * 1e3:.1f} ms" for p, s in phases.items())
            print(f"\n== {size} ==\n{len(calls)} kernel calls in one step: {split}")
            print(f"kernels back to back {kernels * 1e3:.1f} ms; our step {ours * 1e3:.1f} ms")
            print(
                f"products {flops / 1e9:.2f} GFLOP: {flops / rate * 1e3:.1f} ms at this "
                f"machine's best product rate ({rate / 1e9:.0f} GFLOP/s)"
            )
            if a.no_trl:
                continue
            trl = one_run("trl", model_dir, {"steps": 30, "seed": 0})
            trl_step = statistics.median(trl["seconds"])
            print(
                f"TRL step {trl_step * 1e3:.1f} ms: ours x{trl_step / ours:.2f} faster now; "
                f"at most x{trl_step / kernels:.2f} with every other op free, "
                f"x{trl_step * rate / flops:.2f} with the products at the best rate too"
            )


if __name__ == "__main__":
    main()
