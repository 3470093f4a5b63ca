"""`/docs` is Swagger UI served from this machine (the swagger-ui-bundle package's files and our
own start script) under the dashboard's Content-Security-Policy, never from a CDN; it renders
every route in headless Chromium with no console error and no request to another origin, and
GRPO_DOCS_ENABLED=false turns it off. Before, FastAPI's page loaded its script and styles from
cdn.jsdelivr.net (and ReDoc's from there too), with an inline script no CSP could allow."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.api.conftest import served_over_http
from tests.api.server import serve_in_process
from tests.e2e.services import RunningService
from tests.ui.browser import browser, chromium, console_errors  # noqa: F401  (fixtures)

api = served_over_http()  # a browser loads the docs


TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def test_docs_load_only_local_files_under_a_csp(api: RunningService) -> None:
    r = httpx.get(f"{api.base_url}/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    urls = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert urls and all(not re.match(r"^([a-z]+:)?//", u) for u in urls), urls
    assert "<script>" not in r.text  # no inline script: the CSP would refuse it
    for url in urls:
        asset = httpx.get(f"{api.base_url}/{url}")
        assert asset.status_code == 200, url
        assert asset.headers["content-type"].startswith(TYPES[Path(url).suffix]), url
        assert asset.headers["x-content-type-options"] == "nosniff"
    for missing in ("/docs/assets/index.html", "/docs/assets/..%2Fdocs.html", "/redoc"):
        assert httpx.get(f"{api.base_url}{missing}").status_code == 404, missing


def test_docs_render_in_a_browser_with_no_error(
    api: RunningService,
    browser: webdriver.Chrome,  # noqa: F811
) -> None:
    browser.get(f"{api.base_url}/docs")
    WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    )
    shown = browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    paths = {e.text.replace("\u200b", "") for e in shown}  # Swagger UI breaks paths with ZWSP
    assert {"/v1/jobs", "/v1/jobs/{job_id}/events"} <= paths, paths
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert loaded and all(u.startswith(api.base_url) for u in loaded), loaded
    assert console_errors(browser) == []


def test_docs_can_be_turned_off(tmp_path: Path) -> None:
    with serve_in_process({"GRPO_DOCS_ENABLED": "false"}, tmp_path) as svc:
        client = svc.client(None)
        assert client.get("/docs").status_code == 404
        assert client.get("/docs/assets/start.js").status_code == 404
        assert client.get("/openapi.json").status_code == 200
