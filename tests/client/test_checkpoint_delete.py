"""Deleting checkpoints from the Python client and the `grpo` CLI, against the real service."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grpo_client import ApiError, Client
from service.demo_task import digit_records
from tests.client.shared import Trained, job_spec
from tests.client.test_cli import grpo


def test_client_and_cli_delete_checkpoints(clientside: Trained, tmp_path: Path) -> None:
    key = clientside.svc.new_key(f"ckpt-delete-{tmp_path.name}")
    with Client(clientside.svc.base_url, key) as client:
        client.verifiers.create("digits", "regex", {"pattern": "[0-9]"})  # no sandbox needed
        ds = client.datasets.create("digits", digit_records(8))
        spec = job_spec(ds.id, eval_dataset=None)  # 3 steps, one checkpoint each
        job = client.jobs.wait(client.jobs.create(spec).id, timeout=300)
        assert job.status == "succeeded"
        assert [c.step for c in client.checkpoints.list(job.id)] == [1, 2, 3]

        client.checkpoints.delete(job.id, 1)
        assert [c.step for c in client.checkpoints.list(job.id)] == [2, 3]
        with pytest.raises(ApiError) as missing:
            client.checkpoints.delete(job.id, 1)
        assert missing.value.status == 404

        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
        env |= {"GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": key, "COLUMNS": "120"}
        env |= {"XDG_CONFIG_HOME": str(tmp_path / "config")}
        out = grpo("checkpoints", "delete", job.id, "--step", "latest", "--json", env=env)
        assert json.loads(out.stdout) == {"job_id": job.id, "step": "latest", "deleted": True}
        assert [c.step for c in client.checkpoints.list(job.id)] == [2]
        assert "deleted checkpoint 2" in grpo("checkpoints", "delete", job.id, "--step", "2",
                                              env=env).stdout  # fmt: skip
        assert client.checkpoints.list(job.id) == []
        assert "404" in grpo("checkpoints", "delete", job.id, "--step", "2", env=env, code=1).stderr
        grpo("checkpoints", "delete", job.id, "--step", "two", env=env, code=2)
        grpo("checkpoints", "delete", job.id, env=env, code=2)  # no default step: say which
