"""An environment job's samples in headless Chromium: a row's `messages` is its episode's
whole transcript, and the group's prompt box shows the prompt the group shares (the turns
before the model's first), never completion 0's answers (issue 34)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.client.shared import STEPS, Trained
from tests.ui.browser import PageWait, console_errors, log_in


def _transcript(group: int, index: int, completion: str) -> list[dict[str, str]]:
    """Two turns as `workers.environments.run_episodes` leaves them; `completion` is the last."""
    return [
        {"role": "user", "content": f"episode prompt {group}"},
        {"role": "assistant", "content": f"answer of episode {index}"},
        {"role": "user", "content": "Say it again."},
        {"role": "assistant", "content": completion},
    ]


@pytest.fixture
def episode_rows(trained: Trained, tmp_path: Path) -> Iterator[list[dict]]:
    """The shared job's last train step rewritten as episodes (the worker's own Parquet file,
    `messages` as JSON text as `service.rollouts.format` stores it); put back afterwards."""
    objects = Path(trained.svc.env["GRPO_DATA_DIR"]) / "objects"
    pattern = f"tenants/*/jobs/{trained.job_id}/e*/rollouts/train/step-{STEPS}.parquet"
    (path,) = objects.glob(pattern)
    shutil.copy(path, tmp_path / "original.parquet")
    table = pq.read_table(path)
    rows = table.to_pylist()
    for row in rows:
        messages = _transcript(row["group"], row["index"], row["completion"])
        row["messages"] = json.dumps(messages)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    try:
        yield rows
    finally:
        shutil.copy(tmp_path / "original.parquet", path)


def test_a_groups_prompt_box_shows_the_episodes_prompt(
    trained: Trained, episode_rows: list[dict], browser: webdriver.Chrome
) -> None:
    log_in(browser, trained.svc.base_url, trained.key)
    browser.get(f"{trained.svc.base_url}/ui/jobs/{trained.job_id}")
    PageWait(browser, 30).until(
        lambda d: (
            d.find_element(By.TAG_NAME, "body").get_attribute("data-samples-step")
            == f"train-{STEPS}"
        )
    )
    groups = browser.find_elements(By.CSS_SELECTOR, "#samples-groups .group")
    assert len(groups) == len({r["group"] for r in episode_rows}) >= 2
    for group in groups:
        number = int(group.get_attribute("data-group"))
        prompt = group.find_element(By.CSS_SELECTOR, ".prompt").text
        assert prompt == f"user: episode prompt {number}", prompt
    assert console_errors(browser) == []
