"""The layering, checked at run time as well as by import-linter (`make lint`): what a process
really loads, third-party imports included, which a static graph of our own code cannot see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _loaded_after(code: str) -> set[str]:
    """Top-level names in sys.modules after running `code` in a fresh interpreter."""
    probe = code + "\nimport sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, check=True, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    return set(out.stdout.split())


def test_importing_every_module_under_workers_loads_no_web_framework() -> None:
    loaded = _loaded_after(
        "import importlib, pkgutil, workers\n"
        "names = [m.name for m in pkgutil.walk_packages(workers.__path__, 'workers.')]\n"
        "assert len(names) > 20, names\n"
        "[importlib.import_module(n) for n in names]\n"
    )
    assert "torch" in loaded  # the engine really was imported
    assert loaded.isdisjoint({"fastapi", "starlette", "uvicorn", "service"})
    assert loaded.isdisjoint({"sqlalchemy", "celery", "kombu"})


def test_the_api_process_loads_no_torch() -> None:
    loaded = _loaded_after("import service.main")
    assert "fastapi" in loaded
    assert loaded.isdisjoint({"torch", "transformers", "peft", "safetensors", "trl"})
    assert loaded.isdisjoint({"mlflow", "wandb", "tensorboard", "tensorboardX", "trackio"})


def test_the_job_layer_loads_no_web_framework() -> None:
    loaded = _loaded_after(
        "import service.jobs.lifecycle, service.training.runner, service.training.tasks\n"
        "import service.training.reconciler, service.worker"
    )
    assert "celery" in loaded and "sqlalchemy" in loaded
    assert loaded.isdisjoint({"fastapi", "starlette", "uvicorn"})
