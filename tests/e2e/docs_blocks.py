"""The fenced code blocks of README.md and docs/*.md, and the markers that say which of them a
test does not run.

A marker is an HTML comment on the line just before a block's opening fence (GitHub hides it;
the markdown source shows it):

    <!-- docs-test: output -->          what a command prints, a diagram: not code
    <!-- docs-test: excerpt -->         part of a file or a program: it does not run alone
    <!-- docs-test: skip REASON -->     code that needs what a test machine lacks (a GPU, a
                                        cloud account, the network) or takes minutes

Every other block is code the test runs as written (bash, sh and python; a block of another
language must carry a marker)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = {"bash": "bash", "sh": "bash", "python": "python"}
KINDS = ("output", "excerpt", "skip")
_MARKER = re.compile(r"<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    doc: str  # the path from the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # "output", "excerpt" or "skip ..."; None: the test runs it

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.marker is None


def documents() -> list[Path]:
    """README.md first: its quickstart sets up the server every other document uses."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^(```+)(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
        marker = _MARKER.search(lines[i - 1]) if i else None
        found.append(
            Block(
                doc=str(path.relative_to(ROOT)),
                line=i + 1,
                lang=fence.group(2),
                code="\n".join(lines[i + 1 : end]) + "\n",
                marker=" ".join(marker.groups()).strip() if marker else None,
            )
        )
        i = end + 1
    return found


def problems(block: Block) -> list[str]:
    """What is wrong with a block's marking: an unknown kind, a skip without its reason, a block
    the test cannot run and no marker says so."""
    if block.marker is None:
        if block.lang not in RUNNABLE:
            return [f"{block.name}: a ```{block.lang} block needs a docs-test marker"]
        return []
    kind, _, reason = block.marker.partition(" ")
    if kind not in KINDS:
        return [f"{block.name}: unknown docs-test marker {kind!r} (one of {KINDS})"]
    if kind == "skip" and not reason:
        return [f"{block.name}: `docs-test: skip` needs a reason"]
    return []
