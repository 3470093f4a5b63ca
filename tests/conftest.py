"""Fixtures shared by the whole suite: a moto S3 server over HTTP, a tiny local model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


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
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~3M-parameter random-init Llama with a local tokenizer, saved with save_pretrained."""
    from workers.grpo.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


# `make test` runs each file whole on one of two processes (--dist loadfile), taking files in the
# order collected here (--no-loadscope-reorder: xdist's default starts the files with the most
# tests, the quick unit files, and leaves the one-test e2e files of a minute each for the end,
# where one of them keeps a process busy while the other has nothing left). The directories of
# the longest files go first; the many quick files at the end even out the two processes.
SLOW_FIRST = ("tests/e2e/", "tests/ui/", "tests/deploy/", "tests/workers/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid
        return next((i for i, d in enumerate(SLOW_FIRST) if path.startswith(d)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: files stay whole and in their order within a directory
