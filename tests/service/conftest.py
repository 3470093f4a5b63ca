"""Shared fixtures for the service tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """An in-process moto S3 server over real HTTP; yields its endpoint URL.

    State is shared for the whole session, so tests should use their own bucket or prefix.
    Connect with dummy credentials (e.g. ``testing``/``testing``) and region ``us-east-1``.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
