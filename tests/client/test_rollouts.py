"""Rollouts from the client and the CLI, against the shared trained job (3 steps of 2 prompts x 2
completions, evaluated on 16 records at every step)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from grpo_client import RolloutOut
from tests.client.shared import STEPS, Trained
from tests.client.test_cli import grpo

TRAIN_PER_STEP, EVAL_PER_STEP = 2 * 2, 16
TOTAL = STEPS * (TRAIN_PER_STEP + EVAL_PER_STEP)


@pytest.fixture
def env(trained: Trained, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "120",
            "GRPO_URL": trained.svc.base_url, "GRPO_API_KEY": trained.key}  # fmt: skip


def test_iterating_walks_every_page(trained: Trained) -> None:
    with trained.client() as client:
        page = client.jobs.rollouts(trained.job_id, limit=7)
        assert len(page.data) == 7 and page.has_more and page.next == page.data[-1].id
        rows = list(page)
        assert len(rows) == TOTAL and all(isinstance(r, RolloutOut) for r in rows)
        assert len({r.id for r in rows}) == TOTAL
        step_2 = list(client.jobs.rollouts(trained.job_id, step=2, split="train", limit=3))
        assert [(r.step, r.split, r.group, r.index) for r in step_2] == [
            (2, "train", g, i) for g in range(2) for i in range(2)
        ]
        no_errors = list(client.jobs.rollouts(trained.job_id, verifier_error=False))
        assert len(no_errors) == TOTAL  # the digits verifier never fails


def test_to_pandas_has_every_row_and_field(trained: Trained) -> None:
    with trained.client() as client:
        frame = client.jobs.rollouts(trained.job_id, limit=50).to_pandas()
    assert len(frame) == TOTAL
    assert set(RolloutOut.model_fields) == set(frame.columns)
    train = frame[frame["split"] == "train"]
    assert train.groupby(["step", "group"])["advantage"].sum().abs().max() < 1e-4


def test_download_writes_one_parquet_file(trained: Trained, tmp_path: Path) -> None:
    with trained.client() as client:
        path = client.jobs.download_rollouts(trained.job_id, tmp_path / "r.parquet", split="train")
    table = pq.read_table(path)
    assert table.num_rows == STEPS * TRAIN_PER_STEP
    assert set(table.column("split").to_pylist()) == {"train"}
    assert not list(tmp_path.glob("*.part"))


def test_cli_prints_a_step_as_a_table_or_json(trained: Trained, env: dict[str, str]) -> None:
    shown = grpo("jobs", "rollouts", trained.job_id, "--step", "1", "--split", "train", env=env)
    header = shown.stdout.splitlines()[0].split()
    assert header[:6] == ["split", "group", "index", "record", "reward", "advantage"]
    assert "digits" in header and header[-1] == "completion"
    lines = shown.stdout.splitlines()[1:]
    assert len(lines) == TRAIN_PER_STEP and all(len(line) <= 120 for line in lines)
    rows = json.loads(
        grpo("jobs", "rollouts", trained.job_id, "--step", "1", "--json", env=env).stdout
    )
    assert len(rows) == TRAIN_PER_STEP + EVAL_PER_STEP and {r["step"] for r in rows} == {1}
    assert f"{rows[0]['reward']:.3f}" in shown.stdout
    assert shown.stdout.split("\n")[1].split()[0] == "train"


def test_cli_downloads_parquet(trained: Trained, env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "all.parquet"
    done = grpo("jobs", "rollouts", trained.job_id, "--download", str(target), "--json", env=env)
    assert json.loads(done.stdout)["path"] == str(target)
    assert pq.read_table(target).num_rows == TOTAL
    grpo("jobs", "rollouts", trained.job_id, env=env, code=2)  # neither --step nor --download
