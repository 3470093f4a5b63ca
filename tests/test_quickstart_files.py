"""Following README.md in a checkout leaves nothing for `git status` to offer to commit: every
file its quickstart writes is ignored."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Written outside the bash blocks: the client example's download folder, `make demo`'s state,
# a worktree's symlinked virtual environment (a file to git, which `.venv/` does not match).
ALSO = ["out/job_x-step-30.tar", ".grpo/demo/data/db.sqlite", "demo-out/x", ".venv"]


def quickstart_outputs() -> list[str]:
    """The paths README's bash blocks write: `--out X`, `> X`, `make-tiny-model X`, `mkdir X`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found: set[str] = set()
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        found |= set(re.findall(r"(?:--out|>|make-tiny-model|mkdir -p)\s+\"?([\w./-]+)", block))
    return sorted(found)


def test_every_file_the_quickstart_writes_is_ignored_by_git() -> None:
    written = quickstart_outputs()
    assert {"job.yaml", "ckpt.tar", "./tiny-model"} <= set(written), written  # the parse works
    paths = [p.removeprefix("./") for p in written + ALSO]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert sorted(done.stdout.split()) == sorted(paths), done.stdout
