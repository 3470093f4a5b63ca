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
