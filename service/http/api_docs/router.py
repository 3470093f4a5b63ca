"""Routes of the API docs: `/docs` (the page) and `/docs/assets/{name}` (its files)."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

from service.ui.router import HTML_HEADERS, SECURITY_HEADERS

HERE = Path(__file__).parent
# Swagger UI 5's own files (it renders OpenAPI 3.1, which 4 cannot), as fastapi-offline ships
# them; only the files, its page is not used (it has an inline script).
BUNDLE = Path(fastapi_offline.__file__).parent / "static"
# The only files the page loads; any other name is a 404 (no path from the request is joined).
ASSETS = {
    "swagger-ui-bundle.js": (BUNDLE / "swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": (BUNDLE / "swagger-ui.css", "text/css"),
    "favicon.png": (BUNDLE / "favicon.png", "image/png"),
    "start.js": (HERE / "start.js", "text/javascript"),
}
PAGE = (HERE / "docs.html").read_text(encoding="utf-8")

router = APIRouter(include_in_schema=False)


@router.get("/docs", response_class=HTMLResponse)
def docs_page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers=HTML_HEADERS)


@router.get("/docs/assets/{name}")
def docs_asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise HTTPException(404, "no such file")
    path, kind = ASSETS[name]
    return FileResponse(
        path, media_type=kind, headers={"Cache-Control": "no-cache", **SECURITY_HEADERS}
    )
