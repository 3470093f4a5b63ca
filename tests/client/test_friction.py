"""What a new user of the client and the CLI reached for: `Client()` finding the server and the
key as the CLI does, iterating every job across pages, `--version`, `logout`, whole ids in
tables, and a checkpoint downloaded and unpacked in one command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from grpo_client import Client
from tests.client.shared import Trained, job_spec
from tests.client.test_cli import grpo


def _user(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "60"}


def test_client_reads_the_environment_and_the_login_profile(
    clientside: Trained, tmp_path: Path
) -> None:
    env = _user(tmp_path)
    program = "from grpo_client import Client\nprint(Client().jobs.get('%s').id)"
    run = lambda e: subprocess.run(  # noqa: E731
        [sys.executable, "-c", program % clientside.job_id], env=e, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    from_env = run({**env, "GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": clientside.key})
    assert from_env.stdout.strip() == clientside.job_id, from_env.stderr
    grpo("login", "--url", clientside.svc.base_url, "--api-key", clientside.key, env=env)
    from_profile = run(env)
    assert from_profile.stdout.strip() == clientside.job_id, from_profile.stderr
    assert "logged out" in grpo("logout", env=env).stderr
    anonymous = run({**env, "GRPO_URL": clientside.svc.base_url})  # no key any more
    assert "401" in anonymous.stderr and anonymous.returncode != 0
    assert "not logged in" in grpo("logout", env=env).stderr


def test_iterating_a_job_list_walks_every_page(clientside: Trained) -> None:
    with Client(clientside.svc.base_url, clientside.key) as grpo_client:
        ds = grpo_client.datasets.create("pages", [{"prompt": "Digit 1:", "digit": 1}])
        queued = [
            grpo_client.jobs.create(job_spec(ds.id, eval_dataset=None, queue="nobody-listens"))
            for _ in range(3)
        ]
        first = grpo_client.jobs.list(limit=2)
        assert len(first.data) == 2 and first.has_more
        ids = [job.id for job in grpo_client.jobs.list(limit=2)]
        assert len(ids) == len(set(ids)) >= 4 and {j.id for j in queued} <= set(ids)
        assert clientside.job_id in ids
        for job in queued:
            grpo_client.jobs.cancel(job.id)


def test_version_whole_ids_and_download_with_extract(trained: Trained, tmp_path: Path) -> None:
    env = {**_user(tmp_path), "GRPO_URL": trained.svc.base_url, "GRPO_API_KEY": trained.key}
    assert grpo("--version", env=env).stdout.startswith("grpo 0.")
    listing = grpo("jobs", "list", env=env).stdout  # a 60-column terminal
    assert trained.job_id in listing
    out = grpo("checkpoints", "download", trained.job_id, "--out", str(tmp_path),
               "--extract", "--json", env=env).stdout  # fmt: skip
    folder = Path(json.loads(out)["extracted"])
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(folder).num_parameters() == 2_649_344
    # --out naming a folder that does not exist yet: unpacked into it, the tar not left there
    into = tmp_path / "model"
    out = grpo("checkpoints", "download", trained.job_id, "--out", str(into),
               "--extract", "--json", env=env).stdout  # fmt: skip
    assert json.loads(out)["extracted"] == str(into) and not list(into.glob("*.tar"))
    assert AutoModelForCausalLM.from_pretrained(into).num_parameters() == 2_649_344


def test_named_jobs_datasets_by_name_keywords_and_events(
    clientside: Trained, tmp_path: Path
) -> None:
    env = {**_user(tmp_path), "GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": clientside.key}
    with Client(clientside.svc.base_url, clientside.key) as grpo_client:
        ds = grpo_client.datasets.create("by-name", [{"prompt": "Digit 2:", "digit": 2}])
        job = grpo_client.jobs.create(
            base_model="tiny", dataset="by-name", verifiers=[{"name": "digits"}],
            name="my first run", queue="nobody-listens",
        )  # fmt: skip
        assert job.spec["dataset"] == ds.id and job.spec["name"] == "my first run"
        newer = grpo_client.datasets.create("by-name", [{"prompt": "Digit 3:", "digit": 3}])
        again = grpo_client.jobs.create(  # a name uploaded again names its newest dataset
            base_model="tiny", dataset="by-name", verifiers=[{"name": "digits"}],
            queue="nobody-listens",
        )  # fmt: skip
        assert again.spec["dataset"] == newer.id != ds.id
        grpo_client.jobs.cancel(again.id)
        grpo_client.jobs.cancel(job.id)
    assert "my first run" in grpo("jobs", "list", env={**env, "COLUMNS": "200"}).stdout
    events = grpo("jobs", "events", job.id, env=env).stdout
    assert "status" in events and "job queued" in events
    assert "base_model: tiny" in grpo("jobs", "create", "--help", env=env).stdout
