"""`pip install .` (a wheel, not an editable install) into a fresh virtual environment gives a
working `grpo-service migrate` and `up`: the Alembic scripts ship inside the package.

The fresh environment borrows the project's dependencies from this one through a `.pth` line
(no index here), but not the project itself: it runs from a folder outside the repository, and
the test checks that the code it ran is the installed copy."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx

from tests.e2e.services import free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], check=True, capture_output=True, text=True, timeout=300, **kwargs
    )  # type: ignore[call-overload]


def _source_copy(dest: Path) -> Path:
    """The files git would commit, without build leftovers (setuptools reuses `build/`)."""
    listed = _run("git", "ls-files", "-co", "--exclude-standard", "-z", cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _fresh_install(tmp: Path) -> Path:
    source = _source_copy(tmp / "src")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", tmp / "dist", source, cwd=tmp)  # fmt: skip
    wheel = next((tmp / "dist").glob("grpo_service-*.whl"))
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    deps = sysconfig.get_paths()["purelib"]  # this environment's packages, not its .pth files
    (Path(site.stdout.strip()) / "borrowed-deps.pth").write_text(deps + "\n")
    return venv


def test_an_installed_wheel_migrates_and_serves(tmp_path: Path) -> None:
    venv = _fresh_install(tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(GRPO_DATA_DIR=str(tmp_path / "data"), PYTHONPATH="")
    python, cli = venv / "bin" / "python", venv / "bin" / "grpo-service"

    code = "import service, migrations; print(service.__file__, migrations.__file__)"
    where = _run(python, "-c", code, cwd=work, env=env)
    assert all(str(venv) in path for path in where.stdout.split()), where.stdout

    _run(cli, "migrate", cwd=work, env=env)
    with sqlite3.connect(tmp_path / "data" / "grpo.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert {"jobs", "verifier_versions", "alembic_version"} <= tables

    port = free_port()
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen([cli, "up", "--port", str(port), "--grace-seconds", "5"], cwd=work,
                            env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline, ready = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert ready is not None and ready.status_code == 200, (tmp_path / "up.log").read_text()
        key = _run(cli, "create-api-key", "--tenant", "t", cwd=work, env=env).stdout.split()[-1]
        headers = {"Authorization": f"Bearer {key}"}
        r = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers=headers, timeout=10)
        assert r.status_code == 200 and r.json()["data"] == []
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
