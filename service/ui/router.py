"""Routes of the dashboard: `/ui` (log in, jobs), `/ui/jobs/{id}` (one job: curves, samples),
`/ui/jobs/{id}/playground` (base and checkpoint side by side), `/ui/compare?jobs=a,b` (runs
overlaid), `/ui/evaluations?ids=a,b` (evaluations compared), `/ui/tinker` (Tinker API runs and
their checkpoints), `/ui/static/*`.

The pages hold no data: the browser fetches everything from `/v1` with the API key, so these
routes need no auth and never touch the database. Nothing is fetched from the internet.
"""

from __future__ import annotations

import html
from pathlib import Path
from string import Template

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

HERE = Path(__file__).parent
STATIC = HERE / "static"
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
PAGE = Template((HERE / "templates" / "page.html").read_text(encoding="utf-8"))
BODIES = {
    name: (HERE / "templates" / f"{name}.html").read_text(encoding="utf-8")
    for name in ("jobs", "job", "compare", "playground", "evaluations", "tinker")
}
# The pages run only their own scripts and styles and talk only to this origin: an injected
# script or style in fetched data could neither run nor send the API key elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": CSP,
}
HTML_HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", **SECURITY_HEADERS}

router = APIRouter(prefix="/ui", include_in_schema=False)


def render(page: str, title: str, job_id: str = "") -> HTMLResponse:
    body = PAGE.substitute(
        title=html.escape(title),
        page=page,
        job_id=html.escape(job_id, quote=True),
        body=BODIES[page],
    )
    return HTMLResponse(body, headers=HTML_HEADERS)


@router.get("")
def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/", response_class=HTMLResponse)
def jobs_page() -> HTMLResponse:
    return render("jobs", "Jobs")


@router.get("/compare", response_class=HTMLResponse)
def compare_page() -> HTMLResponse:
    """2-4 runs overlaid; the browser reads the job ids from the query string."""
    return render("compare", "Compare runs")


@router.get("/evaluations", response_class=HTMLResponse)
def evaluations_page() -> HTMLResponse:
    """Evaluations listed, the ticked ones compared (reward, verifier means, pass@k)."""
    return render("evaluations", "Evaluations")


@router.get("/tinker", response_class=HTMLResponse)
def tinker_page() -> HTMLResponse:
    """The tenant's Tinker training runs beside its jobs, each with its checkpoints."""
    return render("tinker", "Tinker runs")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str) -> HTMLResponse:
    return render("job", job_id, job_id)


@router.get("/jobs/{job_id}/playground", response_class=HTMLResponse)
def playground_page(job_id: str) -> HTMLResponse:
    """One prompt, the job's base model and a checkpoint of it answering side by side."""
    return render("playground", f"Playground {job_id}", job_id)


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    path = STATIC / name
    kind = STATIC_TYPES.get(path.suffix)
    if kind is None or "/" in name or not path.is_file():
        raise HTTPException(404, "no such file")
    headers = {"Cache-Control": "no-cache", **SECURITY_HEADERS}
    return FileResponse(path, media_type=kind, headers=headers)
