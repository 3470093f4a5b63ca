"""Following README.md and docs/ in a checkout leaves nothing for `git status` to offer to
commit: every file their blocks write is ignored."""

from __future__ import annotations

import re
import subprocess

from tests.e2e.docs_blocks import ROOT, RUNNABLE, blocks, documents

# Written outside the bash blocks: the client example's download folder, the OpenAI example's
# file, `make demo`'s state, a worktree's symlinked virtual environment (a file to git, which
# `.venv/` does not match).
ALSO = ["out/job_x-step-30.tar", "train.jsonl", ".grpo/demo/data/db.sqlite", "demo-out/x", ".venv"]
WRITES = r"(?:--out|>|-o|--download|make-tiny-model|mkdir -p)\s+\"?([\w./-]+)"


def quickstart_outputs() -> list[str]:
    """The paths the docs' shell blocks write: `--out X`, `> X`, `-o X`, `--download X`,
    `make-tiny-model X`, `mkdir X`."""
    found: set[str] = set()
    for doc in documents():
        for block in blocks(doc):
            if block.runs and RUNNABLE[block.lang] == "bash":
                found |= set(re.findall(WRITES, re.sub(r"(?m)(^|\s)#.*$", "", block.code)))
    return sorted(found - {"/dev/null"})


def test_every_file_the_quickstart_writes_is_ignored_by_git() -> None:
    written = quickstart_outputs()
    assert {"job.yaml", "ckpt.tar", "./tiny-model", "changes.yaml"} <= set(written), written
    paths = [p.removeprefix("./") for p in written + ALSO]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert sorted(done.stdout.split()) == sorted(paths), done.stdout
