"""`make demo` says what it is doing before each long silent step (installs, training)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_announces_the_install_and_the_run() -> None:
    # -n: print the recipe without running it; -B: as on a fresh clone (nothing up to date)
    plan = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    first_install = next(i for i, line in enumerate(plan) if "pip install" in line)
    demo = next(i for i, line in enumerate(plan) if "-m service.demo" in line)
    assert plan[0].startswith("echo") and "Installing" in plan[0], plan[:3]
    assert first_install > 0 and plan[demo - 1].startswith("echo"), plan
