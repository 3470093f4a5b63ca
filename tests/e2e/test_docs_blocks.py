"""Every code block of README.md and docs/*.md runs, as written, against one fresh embedded
service (issue 48): README.md's quickstart starts it (`grpo-service up`, the tiny model
registered as `tiny`, `grpo login`, GRPO_URL and GRPO_API_KEY exported), then each document's
blocks run in order in one shell session of their own, from the state the quickstart left (its
variables, functions, files), as a reader who followed the quickstart runs them.

What the test changes: the port (a free one for 8000, as another service may hold 8000); curl
fails on an HTTP error (`--fail-with-body`), so a block whose request is refused fails here; a
python block fails on a FutureWarning (a deprecated SDK call); and a block that prints
`reward A -> B` must show B > A (the training examples learn). The model is the quickstart's
own: `make-tiny-model --chat-template --register tiny`, ~3M parameters, so the training blocks
take under a second a step on a CPU. A block the test does not run carries a marker
(tests/e2e/docs_blocks.py); a `skip` says why, and its reason is one of SKIP_REASONS. Nothing
is cached between runs: the model, the database and every file are made anew under a
temporary folder."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.docs_blocks import ROOT, RUNNABLE, Block, blocks, documents, problems
from tests.e2e.services import free_port

SKIP_REASONS = ("gpu", "cloud", "network", "installs", "docker", "slow")
BLOCK_TIMEOUT_S = 300
# Saves what a block defined (not bash's own variables) for the next block of the document.
_SAVE_STATE = r"""
{ for __v in $(compgen -v); do
    case "$__v" in BASH*|PIPESTATUS|FUNCNAME|GROUPS|_|__*|SHLVL|PWD|OLDPWD|RANDOM|SECONDS|LINENO|\
EPOCH*|SRANDOM|HISTCMD|COMP_*|DIRSTACK|PPID|UID|EUID|SHELLOPTS|IFS|OPTIND|OPTERR|MACHTYPE|\
HOSTTYPE|OSTYPE|HOSTNAME|PS4|PS2) ;;
    *) declare -p "$__v" ;;
    esac
  done; declare -f; } > "$__STATE/vars.sh"
pwd > "$__STATE/cwd"
"""


# curl that fails on an HTTP error status, unless the block asked for --fail itself (-f, -sf).
_CURL = r"""curl() {
  for __a; do [[ "$__a" =~ ^-[a-zA-Z]*f[a-zA-Z]*$|^--fail ]] && { command curl "$@"; return; }; done
  command curl --fail-with-body "$@"
}"""


@dataclass
class Session:
    """One reader's shell: each block a bash process that starts from the state (variables,
    functions, working directory) the document's blocks before it left."""

    work: Path
    state: Path
    env: dict[str, str]
    port: int
    groups: list[int] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    marked: list[Block] = field(default_factory=list)

    def fork(self, name: str) -> Session:
        state = self.work / ".docs-test" / name
        shutil.copytree(self.state, state)
        return Session(self.work, state, self.env, self.port, self.groups)

    def run(self, block: Block) -> None:
        code = block.code.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")
        code = code.replace("localhost:8000", f"localhost:{self.port}")
        code = code.replace("--port 8000", f"--port {self.port}")
        if RUNNABLE[block.lang] == "python":
            program = self.state / f"{len(self.ran)}.py"
            program.write_text(code, encoding="utf-8")
            # a FutureWarning is an error: the docs call no deprecated API (issue 48, item 10)
            code = f'python3 -W error::FutureWarning "{program}"\n'
        script = (
            f'__STATE="{self.state}"\ncd "$(cat "$__STATE/cwd")"\nsource "$__STATE/vars.sh"\n'
            f"set -eo pipefail\n{_CURL}\n"
            f"{code}\n{_SAVE_STATE}"
        )
        log = self.state / f"{len(self.ran)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", script], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # its background processes (`up &`) die with the test
            )  # fmt: skip
            self.groups.append(proc.pid)
            try:
                code_ = proc.wait(timeout=BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code_ = -1
        output = log.read_text(errors="replace")
        assert code_ == 0, (
            f"{block.name} exited {code_}:\n{block.code}\n--- output\n{output[-6000:]}"
        )
        # a training example that prints its reward at the first and the last step learned
        for first, last in re.findall(r"reward ([\d.]+) -> ([\d.]+)", output):
            assert float(last) > float(first), f"{block.name} learned nothing:\n{output[-3000:]}"
        self.ran.append(block.name)

    def run_document(self, doc: str) -> None:
        """Run a document's unmarked blocks in order; keep the marked ones."""
        for block in blocks(ROOT / doc):
            if block.runs:
                self.run(block)
            else:
                self.marked.append(block)

    def stop(self) -> None:
        for group in self.groups:
            _signal(group, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_signal(g, 0) for g in self.groups):
            time.sleep(0.2)
        for group in self.groups:
            _signal(group, signal.SIGKILL)


def _signal(group: int, sig: int) -> bool:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """A fresh folder with `docs/` in it (the docs name files under docs/examples), a shell
    whose `python3`, `grpo` and `grpo-service` are this virtual environment's, and README.md's
    blocks run in it: the quickstart, then the rest of README."""
    work = tmp_path_factory.mktemp("docs")
    (work / "docs").symlink_to(ROOT / "docs")
    state = work / ".docs-test" / "README"
    state.mkdir(parents=True)
    (state / "cwd").write_text(str(work))
    (state / "vars.sh").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        "XDG_CONFIG_HOME": str(work / "config"),  # `grpo login` writes its profile here
        "OMP_NUM_THREADS": "1",
    }
    session = Session(work, state, env, free_port())
    try:
        session.run_document("README.md")
        yield session
    finally:
        session.stop()


def test_every_block_runs_or_is_marked_with_a_reason() -> None:
    found = [b for doc in documents() for b in blocks(doc)]
    assert len(found) > 40, len(found)  # the parse finds the blocks
    wrong = [p for b in found for p in problems(b)]
    wrong += [
        f"{b.name}: skip reason {b.marker!r} is none of {SKIP_REASONS}"
        for b in found
        if b.marker
        and b.marker.startswith("skip ")
        and b.marker.split()[1].rstrip(":") not in SKIP_REASONS
    ]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("doc", [str(d.relative_to(ROOT)) for d in documents()])
def test_the_documents_blocks_run_as_written(quickstart: Session, doc: str) -> None:
    session = quickstart
    if doc != "README.md":
        session = quickstart.fork(re.sub(r"\W", "-", doc))
        session.run_document(doc)
    assert session.ran == [b.name for b in blocks(ROOT / doc) if b.runs]
    for block in session.marked:  # listed in the test's output: what a reader must run elsewhere
        print(f"not run: {block.name} ({block.marker})")
