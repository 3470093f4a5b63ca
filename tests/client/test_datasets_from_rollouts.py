"""Datasets made from the shared trained job's real rollouts (3 steps of 2 prompts x 2
completions, scored by the digits verifier), from the client and the CLI; the expected records
are computed from the rollouts the job stored."""

from __future__ import annotations

import json
import os
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from grpo_client import RolloutOut
from tests.client.shared import STEPS, Trained
from tests.client.test_cli import grpo


@pytest.fixture
def env(trained: Trained, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "GRPO_URL": trained.svc.base_url, "GRPO_API_KEY": trained.key}  # fmt: skip


def _train_rows(trained: Trained) -> list[RolloutOut]:
    with trained.client() as client:
        rows = list(client.jobs.rollouts(trained.job_id, split="train"))
    assert len(rows) == STEPS * 2 * 2
    return rows


def _dpo(rows: list[RolloutOut]) -> list[dict[str, Any]]:
    pairs = []
    for _, members in groupby(rows, key=lambda r: (r.step, r.group)):
        group = list(members)
        best, worst = max(group, key=lambda r: r.reward), min(group, key=lambda r: r.reward)
        if best.reward != worst.reward:
            pairs.append({"prompt": best.prompt, "chosen": best.completion,
                          "rejected": worst.completion})  # fmt: skip
    return pairs


def test_client_makes_sft_and_dpo_datasets_of_the_rollouts(
    trained: Trained, tmp_path: Path
) -> None:
    rows = _train_rows(trained)
    with trained.client() as client:
        sft = client.datasets.from_rollouts(trained.job_id, "sft")
        got = [r.record for r in client.datasets.records(sft.id, limit=5)]  # walks every page
        assert got == [
            {"prompt": r.prompt, "completion": r.completion, "reward": r.reward} for r in rows
        ]
        path = client.datasets.download(sft.id, tmp_path / "sft.jsonl")
        assert [json.loads(line) for line in path.read_text().splitlines()] == got
        expected = _dpo(rows)
        if not expected:  # every group of this run scored its two completions alike
            pytest.skip("no group of the trained job has differing rewards")
        dpo = client.datasets.from_rollouts(trained.job_id, "dpo", steps=range(1, STEPS + 1))
        assert [r.record for r in client.datasets.records(dpo.id)] == expected


def test_cli_makes_a_dataset_and_pages_its_records(trained: Trained, env: dict[str, str]) -> None:
    rows = _train_rows(trained)
    made = json.loads(
        grpo(
            "datasets",
            "from-rollouts",
            trained.job_id,
            "--format",
            "sft",
            "--step",
            "2",
            "--json",
            env=env,
        ).stdout  # fmt: skip
    )
    assert made["num_records"] == 4 and made["name"] == f"{trained.job_id}-sft"
    page = json.loads(grpo("datasets", "records", made["id"], "--limit", "3", "--json",
                           env=env).stdout)  # fmt: skip
    assert page["has_more"] and page["next"] == "2"
    assert [d["record"]["completion"] for d in page["data"]] == [
        r.completion for r in rows if r.step == 2
    ][:3]
    shown = grpo("datasets", "records", made["id"], "--after", "2", env=env)
    assert shown.stdout.splitlines()[0].split("\t")[0] == "3"
    bad = grpo("datasets", "from-rollouts", trained.job_id, "--format", "kto", env=env, code=1)
    assert "$.format" in bad.stderr
