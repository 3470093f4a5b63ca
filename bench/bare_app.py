"""The floor of `bench/api_load.py`: a bare FastAPI route with no auth, no database and no
middleware, answering the bytes of the job a status poll returns (`BENCH_BARE_BODY`), so the
two phases send equal responses and differ only in what the service does per request."""

from __future__ import annotations

import os

from fastapi import FastAPI, Response

app = FastAPI()
_BODY = os.environ.get("BENCH_BARE_BODY", "{}").encode()


@app.get("/bare")
async def bare() -> Response:
    return Response(_BODY, media_type="application/json")
