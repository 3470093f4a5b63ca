"""The dashboard's playground in headless Chromium against the real service (its `serve`
included): one prompt, the job's base model and a checkpoint answering side by side, streamed
from /v1/chat/completions under the pages' Content-Security-Policy, with no console error."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.client.shared import Trained
from tests.ui.browser import PageWait, console_errors, log_in, wait_for


def test_the_playground_answers_with_the_base_and_a_checkpoint(
    trained: Trained, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    base = trained.svc.base_url
    headers = {"Authorization": f"Bearer {trained.key}"}
    ckpts = httpx.get(f"{base}/v1/jobs/{trained.job_id}/checkpoints", headers=headers).json()
    oldest = min(ckpts["data"], key=lambda c: c["step"])
    log_in(browser, base, trained.key)
    browser.get(f"{base}/ui/jobs/{trained.job_id}")
    link = wait_for(browser, "#job-playground")
    target = f"/ui/jobs/{trained.job_id}/playground"
    PageWait(browser, 20).until(lambda d: (link.get_attribute("href") or "").endswith(target))
    link.click()
    option = wait_for(browser, f"#playground-checkpoint option[value='{oldest['id']}']")
    Select(browser.find_element(By.ID, "playground-checkpoint")).select_by_value(oldest["id"])
    assert option.is_selected()
    prompt = browser.find_element(By.ID, "playground-prompt")
    # the default prompt is one of the job's own (its dataset's "Digit N:"), not a stock one
    PageWait(browser, 20).until(lambda d: prompt.get_attribute("value") != "What is 7 * 6?")
    default = prompt.get_attribute("value") or ""
    assert re.fullmatch(r"Digit \d:", default), default
    prompt.clear()
    prompt.send_keys("Digit 3:")
    browser.find_element(By.ID, "playground-max-tokens").clear()
    browser.find_element(By.ID, "playground-max-tokens").send_keys("12")
    browser.find_element(By.ID, "playground-run").click()
    panes = [browser.find_element(By.ID, p) for p in ("pane-base", "pane-checkpoint")]
    PageWait(browser, 120).until(
        lambda d: all(p.get_attribute("data-done") == "true" for p in panes)
    )
    browser.save_screenshot(str(tmp_path / "playground.png"))
    base_pane, ckpt_pane = panes
    assert base_pane.find_element(By.CLASS_NAME, "pane-model").text == "tiny"
    assert ckpt_pane.find_element(By.CLASS_NAME, "pane-model").text == oldest["id"]
    for pane in panes:
        status = pane.find_element(By.CLASS_NAME, "pane-status").text
        assert status.startswith("finished"), status
        text = pane.find_element(By.CLASS_NAME, "pane-text").get_attribute("textContent")
        assert text, f"{pane.get_attribute('id')} shows no text"
    assert console_errors(browser) == []
