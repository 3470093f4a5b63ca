"""Benchmark the python-verifier sandbox: start-up, batched throughput, naive baseline.

    .venv/bin/python bench/verifiers.py [--items 20000] [--starts 15] [--naive 40]

Prints the sandbox mode, the median start-up time (spawn to first result of a one-item
batch), verifications per second batched through one long-lived sandbox, the same for a
naive baseline (a fresh `python -c` subprocess per call, no sandbox: a lower bound of what a
per-call sandbox would cost), and the ratio. Targets on a 2-core machine: >= 10,000/s batched,
>= 100x naive, start-up < 150 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.verifiers import open_verifier, sandbox_mode  # noqa: E402

SOURCE = "def verify(prompt, completion, answer):\n    return float(completion == answer)\n"


def samples(n: int) -> list[dict[str, str]]:
    return [
        {"prompt": "What is 6*7?", "completion": str(40 + i % 4), "answer": "42"} for i in range(n)
    ]


def startup_ms(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        with open_verifier("python", {"source": SOURCE}, name="bench") as v:
            t0 = time.perf_counter()
            v.score(samples(1))
            times.append((time.perf_counter() - t0) * 1000)
    return times


def batched_per_s(items: int, batch: int) -> float:
    data = samples(batch)
    with open_verifier("python", {"source": SOURCE}, name="bench") as v:
        v.score(data)  # start-up excluded
        done, t0 = 0, time.perf_counter()
        while done < items:
            scores, errors = v.score(data)
            assert errors[0] is None and scores[2] == 1.0
            done += batch
        return done / (time.perf_counter() - t0)


def naive_per_s(calls: int) -> float:
    """A fresh interpreter per verification: spawn, run the verifier on one sample, exit."""
    data = samples(calls)
    code = SOURCE + "import json,sys\ns=json.loads(sys.argv[1])\nprint(verify(**s))\n"
    t0 = time.perf_counter()
    for sample in data:
        out = subprocess.run(
            [sys.executable, "-I", "-S", "-c", code, json.dumps(sample)],
            capture_output=True,
            check=True,
        )
        assert out.stdout.strip() in (b"0.0", b"1.0")
    return calls / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--starts", type=int, default=15)
    parser.add_argument("--naive", type=int, default=40)
    args = parser.parse_args()
    print(f"sandbox mode:            {sandbox_mode()}")
    starts = startup_ms(args.starts)
    print(
        f"start-up (median of {args.starts}): {statistics.median(starts):.1f} ms "
        f"(min {min(starts):.1f}, max {max(starts):.1f})"
    )
    batched = batched_per_s(args.items, args.batch)
    print(f"batched ({args.batch}/batch):     {batched:,.0f} verifications/s")
    naive = naive_per_s(args.naive)
    print(f"naive (process per call): {naive:,.1f} verifications/s")
    print(f"ratio:                   {batched / naive:,.0f}x")


if __name__ == "__main__":
    main()
