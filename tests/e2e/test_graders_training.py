"""A training job whose verifier is an OpenAI string_check grader, through a real worker
(issue 18 item 3): the grader scores every completion 0 or 1, with no errors."""

from __future__ import annotations

import json
from pathlib import Path

from service.demo_task import digit_records
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import wait_final

GRADER = {"type": "string_check", "name": "has the digit", "input": "{{sample.output_text}}",
          "reference": "{{item.digit}}", "operation": "like"}  # fmt: skip


def test_a_job_trains_with_a_string_check_grader(
    embedded_service: RunningService, tmp_path: Path
) -> None:
    client = embedded_service.client(embedded_service.new_key(f"graders-{tmp_path.name}"))
    r = client.post("/v1/verifiers", json={"name": "has-digit", "kind": "openai_grader",
                                           "config": GRADER})  # fmt: skip
    assert r.status_code == 201, r.text
    jsonl = "".join(json.dumps(rec) + "\n" for rec in digit_records(8))
    r = client.post("/v1/datasets", data={"name": "d"}, files={"file": ("d.jsonl", jsonl)})
    assert r.status_code == 201, r.text
    spec = {
        "base_model": TINY,
        "dataset": r.json()["id"],
        "verifiers": [{"name": "has-digit"}],
        "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
        "generation": {"max_new_tokens": 8},
    }
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    final = wait_final(client, r.json()["id"])
    assert final["status"] == "succeeded", embedded_service.logs()
    rows = client.get(f"/v1/jobs/{final['id']}/metrics").json()["data"]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["errors/has-digit"] == 0.0
        # 8 completions a step (2 prompts x 4), each scored 0 or 1: the mean is k / 8.
        assert (row["reward/has-digit"] * 8) % 1 == 0
