"""`make demo`'s program, run as a user runs it, on the tiny random model instead of SmolLM2
(`--model`): the same path (model registration, the embedded service, the evaluations before
and after, the job with its bar, the table) in seconds. tests/e2e/test_real_model.py trains
the real model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS, HELD_OUT = 3, 4


def test_demo_measures_trains_and_compares(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env |= {"GRPO_DEMO_DIR": str(tmp_path / "demo"), "COLUMNS": "300"}
    tiny = tmp_path / "tiny"
    make = [sys.executable, "-m", "service.cli", "make-tiny-model", str(tiny), "--chat-template"]
    subprocess.run(make, cwd=ROOT, env=env, check=True, capture_output=True)
    demo = [
        sys.executable, "-m", "service.demo", "--model", str(tiny), "--name", "tiny-chat",
        "--steps", str(STEPS), "--prompts-per-step", "2", "--group-size", "4",
        "--held-out", str(HELD_OUT), "--max-new-tokens", "6",
    ]  # fmt: skip
    done = subprocess.run(demo, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]

    stages = re.findall(r"^\[(\d)/7\] (.*)$", out, re.MULTILINE)
    assert [int(n) for n, _ in stages] == list(range(1, 8)), out
    assert "registering the model 'tiny-chat'" in stages[2][1]
    assert f"{STEPS}/{STEPS}" in out  # the progress bar reached the last step
    accuracies = re.findall(r"^ +accuracy (\d\.\d\d)$", out, re.MULTILINE)
    assert len(accuracies) == 2, out

    table = out[out.index("[7/7]") :]
    row = re.search(r"held-out accuracy \(greedy\) +│ (\d\.\d\d) +│ (\d\.\d\d)", table)
    assert row is not None and list(row.groups()) == accuracies, table
    assert re.search(r"training reward \(first / last 5 steps\) +│ \d\.\d\d +│ \d\.\d\d", table)
    # three held-out sums, each with its answer before and after, judged right or wrong
    answer = r"""['"].*['"] (right|wrong)"""
    samples = re.findall(rf"│ What is \d\d \+ \d\d\? +│ {answer} +│ {answer}", table)
    assert len(samples) == 3, table
    assert "the service is stopped" in out
    assert (tmp_path / "demo" / "run" / "service.log").is_file()
