"""What the CLI tells a user without being asked twice: a dataset downloaded by its name, a job
summed up by `jobs get`, rewards a person can read, a verifier test that fails when the
verifier does, and a progress display that fits a narrow terminal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.client.shared import STEPS, Trained, job_spec, write_jsonl
from tests.client.test_cli import grpo


@pytest.fixture
def env(clientside: Trained, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "120",
            "GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": clientside.key}  # fmt: skip


def test_datasets_download_by_name_or_id(
    clientside: Trained, env: dict[str, str], tmp_path: Path
) -> None:
    records = [{"prompt": "Zähle bis 3:", "digit": 3}, {"prompt": "Digit 4:", "digit": 4}]
    with clientside.client() as grpo_client:
        ds = grpo_client.datasets.create("to-download", records)
    out = grpo("datasets", "download", "to-download", "--out", str(tmp_path / "a" / "d.jsonl"),
               "--json", env=env)  # fmt: skip
    got = json.loads(out.stdout)
    assert (got["id"], got["records"]) == (ds.id, 2)
    lines = (tmp_path / "a" / "d.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == records
    shown = grpo("datasets", "download", ds.id, "--out", str(tmp_path), env=env).stdout
    assert (tmp_path / f"{ds.id}.jsonl").read_bytes() == (tmp_path / "a" / "d.jsonl").read_bytes()
    assert "2 records of to-download" in shown

    missing = grpo("datasets", "download", "no-such-dataset", env=env, code=1)
    assert "404" in missing.stderr and "no dataset 'no-such-dataset'" in missing.stderr
    other = {**env, "GRPO_API_KEY": clientside.svc.new_key("someone-else")}
    theirs = grpo("datasets", "download", ds.id, "--out", str(tmp_path / "x"), env=other, code=1)
    assert "404" in theirs.stderr and not (tmp_path / "x").exists()
    with clientside.client() as grpo_client:
        twin = grpo_client.datasets.create("to-download", records[:1])
    both = grpo("datasets", "download", "to-download", env=env, code=1)
    assert "2 datasets are named 'to-download'" in both.stderr and twin.id in both.stderr


def test_verifiers_test_exits_1_when_the_verifier_fails_on_a_sample(
    clientside: Trained, env: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "picky.py"
    source.write_text("def verify(prompt, completion, **fields):\n    return 1 / len(completion)\n")
    grpo("verifiers", "create", str(source), "--name", "picky", env=env)
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "p", "completion": "ab"}])
    assert "0.5" in grpo("verifiers", "test", "picky", str(good), env=env).stdout
    samples = [{"prompt": "p", "completion": "ab"}, {"prompt": "p", "completion": ""}]
    bad = write_jsonl(tmp_path / "bad.jsonl", samples)
    failed = grpo("verifiers", "test", "picky", str(bad), env=env, code=1)
    assert "ZeroDivisionError" in failed.stdout  # the table still shows what went wrong
    assert "failed on 1 of 2 samples" in failed.stderr
    as_json = grpo("verifiers", "test", "picky", str(bad), "--json", env=env, code=1)
    result = json.loads(as_json.stdout)
    assert result["scores"][0] == 0.5 and result["errors"][0] is None and result["errors"][1]


def test_jobs_get_sums_up_a_waiting_job(clientside: Trained, env: dict[str, str]) -> None:
    with clientside.client() as grpo_client:
        job = grpo_client.jobs.create(
            job_spec(clientside.dataset_id, queue="nobody-listens", name="waits")
        )
    shown = grpo("jobs", "get", job.id, env=env).stdout
    lines = [" ".join(line.split()) for line in shown.splitlines()]
    assert f"job {job.id} waits" in lines and "status queued" in lines
    assert f"step 0 of {STEPS}" in lines and "checkpoint none yet" in lines
    (warning,) = [line for line in lines if line.startswith("warning ")]
    assert "no_worker" in warning and "nobody-listens" in warning
    api = json.loads(grpo("jobs", "get", job.id, "--json", env=env).stdout)
    assert api["id"] == job.id and api["status"] == "queued" and "error" in api  # the job as is
    grpo("jobs", "cancel", job.id, env=env)


THIRD = "def verify(prompt, completion, **fields):\n    return 1 / 3\n"


@pytest.fixture(scope="module")
def third(clientside: Trained) -> str:
    """A job of one step whose every completion scores 1/3 (after the shared job: one worker)."""
    with clientside.client() as grpo_client:
        grpo_client.verifiers.create_python("third", THIRD)
        spec = job_spec(clientside.dataset_id, verifiers=[{"name": "third"}], eval_dataset=None,
                        grpo={"steps": 1, "prompts_per_step": 1, "group_size": 2})  # fmt: skip
        job = grpo_client.jobs.wait(grpo_client.jobs.create(spec).id, timeout=300)
    assert job.status == "succeeded", (job, clientside.svc.logs())
    return job.id


def test_jobs_list_rounds_rewards(third: str, env: dict[str, str]) -> None:
    listing = grpo("jobs", "list", "--limit", "100", env={**env, "COLUMNS": "200"}).stdout
    (row,) = [line.split() for line in listing.splitlines() if third in line]
    assert row[:4] == [third, "succeeded", "1/1", "0.333"], listing  # id, status, step, reward


def test_jobs_get_sums_up_a_trained_job(
    clientside: Trained, third: str, env: dict[str, str]
) -> None:
    with clientside.client() as grpo_client:
        last = grpo_client.checkpoints.get(third, "latest")
    lines = [
        " ".join(line.split()) for line in grpo("jobs", "get", third, env=env).stdout.splitlines()
    ]
    assert "status succeeded" in lines and "step 1 of 1" in lines
    assert "reward 0.333 (at start 0.333)" in lines, lines
    (ckpt,) = [line for line in lines if line.startswith("checkpoint ")]
    assert ckpt.startswith("checkpoint step 1, ") and ckpt.endswith(last.id)
    assert not [line for line in lines if line.startswith(("warning ", "error "))]


def test_watch_fits_a_narrow_terminal(third: str, env: dict[str, str]) -> None:
    narrow = grpo("jobs", "watch", third, env={**env, "COLUMNS": "60"}).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 60, narrow
    (bar,) = [line for line in narrow.splitlines() if "ETA" in line]
    assert "━" in bar and " 1/1 " in bar, narrow  # the bar, the step count, and whole:
    assert bar.rstrip().endswith("succeeded  reward 0.333"), narrow
    final = [line for line in narrow.splitlines() if line.startswith(f"{third}  succeeded")]
    assert final, narrow  # the last line, on a line of its own after the display
