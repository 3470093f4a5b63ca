"""Headless Chromium (Debian's chromium + chromedriver, driven by selenium) for the dashboard
tests, and the few steps every test takes: log in, wait for an element, read the console."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver  # a dev dependency: never skipped
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """One headless Chromium for the session's dashboard tests (tests/ui runs on one process):
    each test gets a fresh tab of it (`browser`)."""
    if not (Path(CHROMEDRIVER).exists() and Path(CHROMIUM).exists()):
        pytest.fail("chromium and chromium-driver are needed (.ci/ensure-services.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium")
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1400,1800", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: webdriver.Chrome) -> webdriver.Chrome:
    """A new tab, the only one open, with an empty console log. A tab has a sessionStorage of
    its own, where the dashboard keeps the API key: each test starts logged out, as in a
    fresh browser (the dashboard keeps nothing in cookies or localStorage)."""
    earlier = chromium.window_handles
    chromium.switch_to.new_window("tab")
    fresh = chromium.current_window_handle
    for handle in earlier:
        chromium.switch_to.window(handle)
        chromium.close()
    chromium.switch_to.window(fresh)
    chromium.get_log("browser")  # what earlier tabs logged
    return chromium


def console_errors(driver: webdriver.Chrome) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


class PageWait(WebDriverWait):
    """A WebDriverWait that polls on through a page load. The login form reloads the page and
    links navigate; a command that reaches Chromium while its document is being replaced fails
    with "aborted by navigation", which means "not there yet", not a broken page."""

    def until(self, method: Callable[[Any], Any], message: str = "") -> Any:  # noqa: ANN401
        def through_navigation(driver: Any) -> Any:  # noqa: ANN401
            try:
                return method(driver)
            except WebDriverException as error:
                if "aborted by navigation" in (error.msg or ""):
                    return False
                raise

        return super().until(through_navigation, message)


def wait_for(driver: webdriver.Chrome, css: str, timeout: float = 20) -> WebElement:
    return PageWait(driver, timeout).until(lambda d: d.find_element(By.CSS_SELECTOR, css))


def log_in(driver: webdriver.Chrome, base_url: str, key: str) -> None:
    driver.get(f"{base_url}/ui/")
    wait_for(driver, "#login-form")
    driver.find_element(By.ID, "api-key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait_for(driver, "#jobs tbody tr")
