"""The dashboard's samples view, charts, run comparison and cancel button in headless
Chromium, against the real service with worker-trained jobs: the rows come from the real
`GET /v1/jobs/{id}/rollouts`, and every tenant string carries an XSS payload that must show
literally and run nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from tests.client.shared import STEPS, Trained, job_spec
from tests.ui.browser import PageWait, console_errors, log_in, wait_for

XSS = "<img src=x onerror=window.__xss=1>"
# Fails on odd digits, so one of the two records' rows carries a verifier error, whose
# message is tenant text too.
ODD_FAILS = f"""
def verify(prompt, completion, digit, **fields):
    if digit % 2:
        raise ValueError({XSS!r} + " odd digit")
    return 1.0 if str(digit) in completion else 0.0
"""
NAME = f"xss run {XSS}"


@dataclass
class Runs:
    trained: Trained
    xss_job: str
    live_job: str
    shots: Path


def plant_completion(trained: Trained, job_id: str, step: int) -> None:
    """A tiny random model never writes markup, so step `step`'s first two stored rows are
    rewritten as if the model had: row 0 the XSS string with reward 1, row 1 reward 0 (so a
    reward filter has something to hide). The file stays the worker's own Parquet."""
    objects = Path(trained.svc.env["GRPO_DATA_DIR"]) / "objects"
    (path,) = objects.glob(f"tenants/*/jobs/{job_id}/e*/rollouts/train/step-{step}.parquet")
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0] |= {"completion": XSS, "reward": 1.0}
    rows[1] |= {"reward": 0.0}
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


@pytest.fixture(scope="module")
def runs(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """The shared finished job, a finished job whose name, prompts, verifier errors and one
    completion hold the XSS string, and a long job left running (storing no rollouts)."""
    with trained.client() as grpo:
        grpo.verifiers.create_python("odd-fails", ODD_FAILS)
        records = [{"prompt": f"Digit {d}: {XSS}", "digit": d} for d in (3, 4)]
        ds = grpo.datasets.create("xss-digits", records)
        spec = job_spec(ds.id, name=NAME, checkpoint_every=100,
                        verifiers=[{"name": "digits"}, {"name": "odd-fails"}])  # fmt: skip
        xss_job = grpo.jobs.create(spec).id
        assert grpo.jobs.wait(xss_job, timeout=300).status == "succeeded"
        plant_completion(trained, xss_job, 2)
        long = {"steps": 500, "prompts_per_step": 2, "group_size": 2}
        live_job = grpo.jobs.create(
            job_spec(ds.id, name="long run", rollouts="none", grpo=long, checkpoint_every=1000)
        ).id
    shots = tmp_path_factory.mktemp("shots")  # screenshots, to look at after a run
    yield Runs(trained, xss_job, live_job, shots)
    with trained.client() as grpo:  # leave the shared service idle for the tests after these
        if grpo.jobs.get(live_job).status not in ("cancelled", "succeeded", "failed"):
            grpo.jobs.cancel(live_job)
        grpo.jobs.wait(live_job, timeout=120)


def api_rows(runs: Runs, job_id: str, **params: object) -> list[dict]:
    """Every row the API gives for these filters (the page is larger than one step)."""
    r = httpx.get(
        f"{runs.trained.svc.base_url}/v1/jobs/{job_id}/rollouts",
        params={"limit": 100, **params},
        headers={"Authorization": f"Bearer {runs.trained.key}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert not r.json()["has_more"]
    return r.json()["data"]


def open_job(browser: webdriver.Chrome, runs: Runs, job_id: str) -> None:
    log_in(browser, runs.trained.svc.base_url, runs.trained.key)
    browser.get(f"{runs.trained.svc.base_url}/ui/jobs/{job_id}")
    PageWait(browser, 30).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-final")
    )


def shown_step(browser: webdriver.Chrome, expected: str) -> None:
    PageWait(browser, 15).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-samples-step") == expected
    )


def samples(browser: webdriver.Chrome, css: str = "#samples-groups .sample") -> list:  # noqa: ANN201
    return browser.find_elements(By.CSS_SELECTOR, css)


def screenshot(browser: webdriver.Chrome, element_id: str, path: Path) -> None:
    """The window scrolled to the element (an element shot is cut at the window's edge)."""
    browser.execute_script("document.getElementById(arguments[0]).scrollIntoView()", element_id)
    browser.save_screenshot(str(path))


def assert_nothing_injected(browser: webdriver.Chrome) -> None:
    assert browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.execute_script("return window.__xss === undefined")


def test_samples_view_pages_filters_and_shows_text_literally(
    runs: Runs, browser: webdriver.Chrome
) -> None:
    by_step = {s: api_rows(runs, runs.xss_job, step=s, split="train") for s in (2, 3)}
    open_job(browser, runs, runs.xss_job)
    shown_step(browser, f"train-{STEPS}")
    cards = samples(browser)
    assert sorted(c.get_attribute("data-id") for c in cards) == sorted(r["id"] for r in by_step[3])
    group = browser.find_elements(By.CSS_SELECTOR, "#samples-groups .group")
    assert len(group) == 2 and all(len(samples(g, ".sample")) == 2 for g in group)
    scores = {s.get_attribute("data-verifier") for s in samples(browser, "#samples-groups .score")}
    assert scores == {"digits", "odd-fails"}
    errors = samples(browser, "#samples-groups .verifier-error")
    expected = [f"{n}: {m}" for r in by_step[3] for n, m in r["errors"].items()]
    assert sorted(e.text for e in errors) == sorted(expected) and len(expected) == 2
    assert all(XSS in text for text in expected)
    assert XSS in browser.find_element(By.CSS_SELECTOR, "#samples-groups .prompt").text
    bars = samples(browser, "#chart-histogram rect.bar")
    assert sum(int(b.get_attribute("data-count")) for b in bars) == len(by_step[3])

    browser.find_element(By.ID, "samples-step").send_keys(Keys.LEFT)  # the slider, one step back
    shown_step(browser, "train-2")
    completions = [c.text for c in samples(browser, "#samples-groups .completion")]
    assert XSS in completions  # literal text, not an element
    assert_nothing_injected(browser)
    screenshot(browser, "samples", runs.shots / "samples-step2.png")

    browser.find_element(By.ID, "samples-min").send_keys("0.5")
    PageWait(browser, 10).until(lambda d: len(samples(d)) < len(by_step[2]))
    kept = [r["id"] for r in by_step[2] if r["reward"] >= 0.5]
    assert sorted(c.get_attribute("data-id") for c in samples(browser)) == sorted(kept)
    assert all(float(c.get_attribute("data-reward")) >= 0.5 for c in samples(browser))
    browser.find_element(By.ID, "samples-min").clear()
    browser.find_element(By.ID, "samples-errors").click()
    PageWait(browser, 10).until(
        lambda d: all("has-error" in c.get_attribute("class") for c in samples(d))
    )
    assert len(samples(browser)) == sum(1 for r in by_step[2] if r["errors"])

    Select(browser.find_element(By.ID, "samples-split")).select_by_value("eval")
    shown_step(browser, f"eval-{STEPS}")
    browser.find_element(By.ID, "samples-errors").click()
    PageWait(browser, 10).until(lambda d: len(samples(d)) > 0)
    assert all("adv —" in c.text for c in samples(browser))  # eval rows have no advantage
    assert console_errors(browser) == []


def test_diff_shows_one_record_at_two_steps(runs: Runs, browser: webdriver.Chrome) -> None:
    open_job(browser, runs, runs.xss_job)
    shown_step(browser, f"train-{STEPS}")
    record = Select(browser.find_element(By.ID, "diff-record"))
    record.select_by_index(1)
    chosen = record.first_selected_option.get_attribute("value")
    Select(browser.find_element(By.ID, "diff-a")).select_by_value("1")
    PageWait(browser, 10).until(
        lambda d: (
            [c.get_attribute("data-step") for c in samples(d, "#diff .diff-col")]
            == ["1", str(STEPS)]
        )
    )
    for column in samples(browser, "#diff .diff-col"):
        cards = samples(column, ".sample")
        step = column.get_attribute("data-step")
        assert len(cards) == 2 and all(c.get_attribute("data-step") == step for c in cards)
        assert column.find_element(By.CLASS_NAME, "group-head").text.startswith(f"step {step}")
    (first, *_) = api_rows(runs, runs.xss_job, step=1, split="train", record=chosen)
    assert browser.find_element(By.ID, "diff-prompt").text == first["prompt"]
    screenshot(browser, "diff-prompt", runs.shots / "diff.png")
    assert console_errors(browser) == []


def test_charts_per_verifier_smoothing_and_tooltip(runs: Runs, browser: webdriver.Chrome) -> None:
    open_job(browser, runs, runs.xss_job)
    assert browser.find_element(By.ID, "job-title").text == f"{NAME} ({runs.xss_job})"
    for metric in ("reward/digits", "reward/odd-fails", "entropy", "grad_norm", "kl"):
        line = wait_for(browser, f"#charts polyline[data-series='{metric}']")
        assert line.get_attribute("data-points") == str(STEPS), metric
    assert wait_for(browser, "#chart-verifier-errors polyline[data-series='errors/odd-fails']")
    assert browser.find_elements(By.CSS_SELECTOR, ".chart[data-verifier='odd-fails']")
    slider = browser.find_element(By.ID, "smoothing")
    browser.execute_script(
        "arguments[0].value = '0.9'; arguments[0].dispatchEvent(new Event('input'))", slider
    )
    reward = browser.find_element(By.CSS_SELECTOR, "#chart-reward polyline[data-series]")
    assert reward.get_attribute("data-smoothing") == "0.9"
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-reward polyline.raw")
    chart = browser.find_element(By.CSS_SELECTOR, "#chart-kl svg")
    ActionChains(browser).move_to_element(chart).perform()
    tip = PageWait(browser, 5).until(
        lambda d: (
            d.find_element(By.ID, "chart-tip")
            if d.find_element(By.ID, "chart-tip").is_displayed()
            else None
        )
    )
    assert tip.text.startswith("step ") and "KL: " in tip.text
    browser.save_screenshot(str(runs.shots / "charts.png"))
    browser.execute_script(
        "arguments[0].value = '0'; arguments[0].dispatchEvent(new Event('input'))", slider
    )
    assert console_errors(browser) == []


def test_compare_overlays_the_picked_runs(runs: Runs, browser: webdriver.Chrome) -> None:
    log_in(browser, runs.trained.svc.base_url, runs.trained.key)
    row = wait_for(browser, f"#jobs tr[data-job-id='{runs.xss_job}']")
    assert row.find_element(By.CLASS_NAME, "job-name").text == NAME
    compare = browser.find_element(By.ID, "compare")
    assert not compare.is_enabled()
    for job_id in (runs.trained.job_id, runs.xss_job):
        browser.find_element(By.CSS_SELECTOR, f"#jobs tr[data-job-id='{job_id}'] .pick").click()
    compare.click()
    PageWait(browser, 20).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-drawn") == "2"
    )
    lines = samples(browser, "#compare-reward_mean polyline[data-series]")
    assert {x.get_attribute("data-series") for x in lines} == {runs.trained.job_id, runs.xss_job}
    assert all(x.get_attribute("data-points") == str(STEPS) for x in lines)
    legend = [x.text for x in samples(browser, "#compare-reward_mean .legend-item")]
    assert legend == [runs.trained.job_id, NAME]  # the unnamed job goes by its id
    assert len(samples(browser, "#compare-eval_reward_mean polyline[data-series]")) == 2
    assert_nothing_injected(browser)
    browser.save_screenshot(str(runs.shots / "compare.png"))
    assert console_errors(browser) == []


def test_cancel_a_live_job_after_confirming(runs: Runs, browser: webdriver.Chrome) -> None:
    log_in(browser, runs.trained.svc.base_url, runs.trained.key)
    browser.get(f"{runs.trained.svc.base_url}/ui/jobs/{runs.live_job}")
    button = PageWait(browser, 20).until(
        lambda d: (
            d.find_element(By.ID, "job-cancel")
            if d.find_element(By.ID, "job-cancel").is_displayed()
            else None
        )
    )
    PageWait(browser, 20).until(
        lambda d: "rollouts: none" in d.find_element(By.ID, "samples-empty").text
    )
    button.click()
    browser.switch_to.alert.dismiss()  # "no": nothing happens
    assert browser.find_element(By.ID, "job-status").text in ("queued", "running")
    button.click()
    browser.switch_to.alert.accept()
    PageWait(browser, 20).until(
        lambda d: d.find_element(By.ID, "job-status").text in ("cancelling", "cancelled")
    )
    with runs.trained.client() as grpo:
        assert grpo.jobs.wait(runs.live_job, timeout=120).status == "cancelled"
    PageWait(browser, 20).until(lambda d: d.find_element(By.ID, "job-status").text == "cancelled")
    assert not browser.find_element(By.ID, "job-cancel").is_displayed()
    browser.save_screenshot(str(runs.shots / "cancelled.png"))
    assert console_errors(browser) == []
