"""The client installs on its own: `pip install service/client` into a fresh virtual environment
(no system site-packages) brings httpx, pydantic, typer and rich and none of the server's stack,
and its `grpo` CLI talks to a real API process.

pip resolves the dependencies from its usual indexes and reuses its cache of downloads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.api.server import run_api
from tests.e2e.services import RunningService

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "service" / "client"
SERVER_STACK = ("torch", "transformers", "fastapi", "sqlalchemy", "celery", "service", "workers")


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs
    )  # type: ignore[call-overload]


def _install_client_alone(tmp: Path) -> Path:
    """A fresh venv with only grpo-client in it. This environment's pip builds the wheel from a
    copy of the folder (setuptools' leftovers stay out of the repository) and installs it with
    its dependencies into the venv (`pip --python`), which so needs no pip of its own."""
    source = shutil.copytree(
        CLIENT, tmp / "client", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    )
    pip = (sys.executable, "-m", "pip")
    dist = tmp / "dist"
    built = _run(*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, source)
    assert built.returncode == 0, built.stderr[-4000:]
    wheel = next(dist.glob("grpo_client-*.whl"))
    venv = tmp / "venv"
    made = _run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert made.returncode == 0, made.stderr
    installed = _run(*pip, "--python", venv / "bin" / "python", "install", "-q", wheel)
    assert installed.returncode == 0, installed.stderr[-4000:]
    return venv


def test_the_client_installs_alone_and_talks_to_a_server(tmp_path: Path) -> None:
    (tmp_path / "api").mkdir()
    with ThreadPoolExecutor(1) as pool:  # the API starts while pip installs
        installing = pool.submit(_install_client_alone, tmp_path)
        with run_api({}, tmp_path / "api") as svc:
            _check_the_client(installing.result(), tmp_path, svc)


def _check_the_client(venv: Path, tmp_path: Path, svc: RunningService) -> None:
    python, grpo = venv / "bin" / "python", venv / "bin" / "grpo"
    elsewhere = tmp_path / "elsewhere"  # not the repository: nothing importable by accident
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "PYTHON"))}
    env["HOME"] = str(tmp_path)  # no stored `grpo login` of the machine's

    probe = (
        "import importlib.util, json, sys\n"
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))"
    )
    found = _run(python, "-c", probe, "grpo_client", *SERVER_STACK, cwd=elsewhere, env=env)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {"grpo_client": True} | {m: False for m in SERVER_STACK}

    helped = _run(grpo, "--help", cwd=elsewhere, env=env)
    assert helped.returncode == 0, helped.stderr
    assert "jobs" in helped.stdout and "whoami" in helped.stdout

    env |= {"GRPO_URL": svc.base_url, "GRPO_API_KEY": svc.new_key("alone")}
    me = _run(grpo, "whoami", "--json", cwd=elsewhere, env=env)
    assert me.returncode == 0, me.stderr + svc.logs()
    assert json.loads(me.stdout)["tenant"] == "alone"

    records = elsewhere / "digits.jsonl"
    records.write_text("".join(json.dumps({"prompt": f"Digit {d}:"}) + "\n" for d in range(3)))
    uploaded = _run(grpo, "datasets", "upload", records, "--json", cwd=elsewhere, env=env)
    assert uploaded.returncode == 0, uploaded.stderr + svc.logs()
    dataset = json.loads(uploaded.stdout)  # through the generated DatasetOut
    assert dataset["name"] == "digits" and dataset["num_records"] == 3
