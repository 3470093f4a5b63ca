"""`make demo`'s program, the first command of the README, run as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_trains_downloads_and_loads_a_checkpoint(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env |= {"GRPO_DEMO_DIR": str(tmp_path / "demo"), "COLUMNS": "300"}
    done = subprocess.run(
        [sys.executable, "-m", "service.demo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "30/30" in out  # the progress bar reached the last step
    assert re.search(r"downloaded step 30 to .*checkpoint\.tar: sha256 matches", out), out
    assert "from_pretrained loaded it" in out
    assert (tmp_path / "demo" / "checkpoint" / "model.safetensors").is_file()
    first, last = map(
        float, re.search(r"first 5 steps ([\d.]+) -> last 5 steps ([\d.]+)", out).groups()
    )
    assert last > first, out[-2000:]
