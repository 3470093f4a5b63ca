"""`make venv` installs both distributions editable with `pip install -q`, which still prints
whatever the build backend warns: a deprecated license table or an editable install through an
import hook printed screens of `!!` boxes that looked like errors (issue 48). Each project's
editable wheel is built here, as pip builds it, and must warn of nothing."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = {"grpo_service": ROOT, "grpo_client": ROOT / "service" / "client"}
# The build hook pip calls, in a fresh interpreter that shows every warning once.
HOOK = "import sys; from setuptools import build_meta as b; print(b.build_editable(sys.argv[1]))"


def _copy_sources(project: Path, dest: Path) -> Path:
    """The files git would commit under `project` (no egg-info or build/ a real install left)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "."],
        cwd=project, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        src = project / name
        if src.is_file() and not name.startswith(("tests/", "docs/", "bench/", "k8s/")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
    return dest


@pytest.mark.parametrize("dist", sorted(PROJECTS))
def test_the_editable_build_warns_of_nothing(dist: str, tmp_path: Path) -> None:
    source = _copy_sources(PROJECTS[dist], tmp_path / "src")
    out = tmp_path / "wheel"
    out.mkdir()
    built = subprocess.run(
        [sys.executable, "-W", "always", "-c", HOOK, str(out)],
        cwd=source, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    said = built.stdout + built.stderr
    assert "Warning" not in said and "!!" not in said, said[-3000:]
    # A plain .pth line, not a meta path finder: the layout pip reports nothing about.
    with zipfile.ZipFile(out / built.stdout.strip().splitlines()[-1]) as wheel:
        names = wheel.namelist()
        pth = [n for n in names if n.endswith(".pth")]
        metadata = wheel.read(next(n for n in names if n.endswith("dist-info/METADATA")))
    assert len(pth) == 1 and not any(n.endswith("_finder.py") for n in names), names
    assert b"License-Expression: Apache-2.0" in metadata
