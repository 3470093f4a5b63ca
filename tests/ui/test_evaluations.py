"""The dashboard's evaluations page in headless Chromium: the trained job's base model and last
checkpoint evaluated on the same records, listed, and compared side by side (reward mean, the
verifier's mean, pass@k with its interval) as the API reports them; no console errors."""

from __future__ import annotations

from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.client.shared import Trained, evaluate
from tests.ui.browser import PageWait, console_errors, log_in, wait_for


def _figures(browser: webdriver.Chrome) -> dict[str, list[str]]:
    rows = browser.find_elements(By.CSS_SELECTOR, "#comparison tbody tr")
    return {
        r.get_attribute("data-figure"): [c.text for c in r.find_elements(By.TAG_NAME, "td")[1:]]
        for r in rows
    }


def test_evaluations_compared(trained: Trained, browser: webdriver.Chrome) -> None:
    base, tuned = evaluate(trained)
    log_in(browser, trained.svc.base_url, trained.key)
    browser.get(f"{trained.svc.base_url}/ui/evaluations?ids={base.id},{tuned.id}")
    PageWait(browser, 20).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-compared") == "2"
    )
    for e in (base, tuned):
        row = wait_for(browser, f"#evaluations tr[data-evaluation-id='{e.id}']")
        assert "succeeded" in row.text and e.model in row.text
    heads = browser.find_elements(By.CSS_SELECTOR, "#comparison thead th[data-evaluation-id]")
    assert [h.get_attribute("data-evaluation-id") for h in heads] == [base.id, tuned.id]
    figures = _figures(browser)
    assert set(figures) == {"reward_mean", "verifier:digits", "pass@1", "pass@2", "samples"}
    for i, e in enumerate((base, tuned)):
        r = e.results
        assert figures["reward_mean"][i] == f"{r.reward_mean:.3f}"
        assert figures["verifier:digits"][i] == f"{r.per_verifier['digits']:.3f}"
        p = r.pass_at_k["2"]
        assert figures["pass@2"][i] == f"{p.estimate:.3f} [{p.low:.2f}, {p.high:.2f}]"
    # unticking one leaves the other alone in the comparison
    box = browser.find_element(By.CSS_SELECTOR, f"tr[data-evaluation-id='{base.id}'] .pick")
    box.click()
    PageWait(browser, 10).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-compared") == "1"
    )
    assert len(_figures(browser)["reward_mean"]) == 1
    assert console_errors(browser) == []
