"""The dashboard in headless Chromium (Debian's chromium + chromedriver, driven by selenium)
against the real service: log in, the jobs list, a finished job's curves, events, checkpoints,
the reward-hacking banner, and no console errors."""

from __future__ import annotations

from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.common.by import By
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.models import JobEvent
from tests.client.shared import STEPS, Trained
from tests.ui.browser import PageWait, console_errors, wait_for


def add_hacking_event(trained: Trained) -> None:
    """The worker emits this when held-out reward falls while train reward rises; a 3-step job
    cannot show that, so the row is written as the worker would write it."""
    engine = create_engine(f"sqlite:///{trained.svc.env['GRPO_DATA_DIR']}/grpo.db")
    with Session(engine) as session:
        session.add(
            JobEvent(
                job_id=trained.job_id,
                type="reward_hacking_suspected",
                message="train reward rises while held-out reward falls",
                data={"step": STEPS},
            )
        )
        session.commit()
    engine.dispose()


def test_dashboard_shows_a_finished_job(
    trained: Trained, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    base = trained.svc.base_url
    browser.get(f"{base}/ui/")
    wait_for(browser, "#login-form")
    browser.find_element(By.ID, "api-key").send_keys("grpo_sk_wrong")
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    PageWait(browser, 10).until(
        lambda d: "not accepted" in d.find_element(By.ID, "login-error").text
    )
    browser.get_log("browser")  # the rejected key's 401 is expected: clear the log

    browser.find_element(By.ID, "api-key").clear()
    browser.find_element(By.ID, "api-key").send_keys(trained.key)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    row = wait_for(browser, f"#jobs tr[data-job-id='{trained.job_id}']")
    assert "succeeded" in row.text and f"{STEPS}/{STEPS}" in row.text

    row.find_element(By.TAG_NAME, "a").click()
    PageWait(browser, 20).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-final")
    )
    train = browser.find_element(
        By.CSS_SELECTOR, "#chart-reward polyline[data-series='reward_mean']"
    )
    assert train.get_attribute("data-points") == str(STEPS)
    steps = browser.find_elements(
        By.CSS_SELECTOR, "#chart-reward circle[data-series='reward_mean']"
    )
    assert sorted(int(c.get_attribute("data-step")) for c in steps) == list(range(1, STEPS + 1))
    held_out = browser.find_element(
        By.CSS_SELECTOR, "#chart-reward polyline[data-series='eval_reward_mean']"
    )
    assert int(held_out.get_attribute("data-points")) >= 1
    for chart in ("kl", "loss", "length", "clip", "time"):
        line = browser.find_element(By.CSS_SELECTOR, f"#chart-{chart} polyline")
        assert line.get_attribute("data-points") == str(STEPS), chart

    types = [
        r.get_attribute("data-type")
        for r in browser.find_elements(By.CSS_SELECTOR, "#events tbody tr")
    ]
    assert "checkpoint" in types and "status" in types, types
    assert len(browser.find_elements(By.CSS_SELECTOR, "#checkpoints button.download")) == STEPS
    assert not browser.find_element(By.ID, "hacking-banner").is_displayed()
    browser.save_screenshot(str(tmp_path / "job.png"))

    add_hacking_event(trained)
    browser.refresh()
    banner = PageWait(browser, 20).until(
        lambda d: (
            d.find_element(By.ID, "hacking-banner")
            if d.find_element(By.ID, "hacking-banner").is_displayed()
            else None
        )
    )
    assert "held-out reward falls" in banner.text
    browser.save_screenshot(str(tmp_path / "job-hacking.png"))
    assert console_errors(browser) == []


def test_pages_and_files_carry_security_headers(trained: Trained) -> None:
    for path in ("/ui/", "/ui/jobs/job_x", "/ui/static/app.js", "/ui/static/style.css"):
        r = httpx.get(trained.svc.base_url + path, timeout=10)
        assert r.status_code == 200, path
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp


def test_a_fine_tuned_job_shows_its_lineage_and_memory_plan(
    trained: Trained, browser: webdriver.Chrome
) -> None:
    with trained.client() as grpo:
        (final, *_) = [c for c in grpo.checkpoints.list(trained.job_id) if c.step == STEPS]
        spec = {"base_model": final.id, "dataset": trained.dataset_id,
                "verifiers": [{"name": "digits"}], "grpo": {"steps": 1, "prompts_per_step": 2,
                "group_size": 2}, "generation": {"max_new_tokens": 4}}  # fmt: skip
        child = grpo.jobs.create(spec)
    browser.get(f"{trained.svc.base_url}/ui/")
    wait_for(browser, "#login-form")
    browser.find_element(By.ID, "api-key").send_keys(trained.key)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait_for(browser, f"#jobs tr[data-job-id='{child.id}'] a").click()
    lineage = PageWait(browser, 20).until(
        lambda d: d.find_element(By.ID, "job-lineage").text or None
    )
    assert lineage == f"fine-tuned from checkpoint {final.id}"
    assert "memory planned" in browser.find_element(By.ID, "job-summary").text
    assert console_errors(browser) == []
