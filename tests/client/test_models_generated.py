"""The client's response models (service/client/grpo_client/models_generated.py) are generated
from the server's OpenAPI document: regenerated from the live `create_app().openapi()`, the file
is unchanged, and the generated models read what the server's own schemas write."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from grpo_client.models import JobCreate, JobOut

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "service" / "client" / "generate_models.py"


def test_the_committed_models_match_the_servers_openapi_document() -> None:
    run = subprocess.run(
        [sys.executable, GENERATOR, "--check"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-6000:]


def test_a_server_job_serialises_into_the_clients_model() -> None:
    from service.jobs.schemas import JobOut as ServerJobOut

    server = ServerJobOut(
        id="job_1", status="running", spec={"base_model": "tiny"}, step=3, total_steps=10,
        latest_metrics={"reward": 0.5}, error=None, created_at="2026-01-01T00:00:00Z",
        started_at="2026-01-01T00:00:01Z", finished_at=None,
    )  # fmt: skip
    client = JobOut.model_validate_json(server.model_dump_json())
    assert json.loads(client.model_dump_json()) == json.loads(server.model_dump_json())
    assert client.status == "running"  # a plain string, as the server's Literal
    assert client.created_at == datetime(2026, 1, 1, tzinfo=UTC)  # a datetime, not a string


def test_the_clients_job_spec_keeps_only_what_was_set() -> None:
    spec = JobCreate(base_model="tiny", dataset="ds_1", grpo={"steps": 2, "group_size": 4})
    assert spec.model_dump(mode="json", exclude_unset=True) == {
        "base_model": "tiny", "dataset": "ds_1", "grpo": {"steps": 2, "group_size": 4},
    }  # fmt: skip
