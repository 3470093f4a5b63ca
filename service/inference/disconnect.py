"""A client that goes away while its completion is made: the API stops asking the backend
(closing its connection to it), and `grpo-service serve` stops decoding (docs/inference.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


async def client_gone(request: Request) -> None:
    """Returns once the HTTP client has disconnected. For a request whose body was read: the
    server's next message is then only `http.disconnect` (uvicorn also sends it once the
    response is complete, so run this only while the response is being made)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, `work`'s result), or (False, None) with `work` cancelled when the client went away
    first; `work`'s exception is raised as its own."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(client_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    await asyncio.wait({task})  # its own clean-up runs (httpx closes the connection)
    if task.cancelled():
        return False, None
    return True, task.result()
