"""A job trains on episodes of a registered environment, through a real worker (issue 19):
the version is pinned in the stored spec, the sandboxed host plays every episode, the metrics
and rollouts are the episodes'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.demo_task import digit_records
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import wait_final

SAY_IT_AGAIN = Path(__file__).parents[2] / "docs" / "examples" / "environments" / "say_it_again.py"


def test_a_job_trains_on_episodes_of_a_registered_environment(
    embedded_service: RunningService, tmp_path: Path
) -> None:
    client = embedded_service.client(embedded_service.new_key(f"episodes-{tmp_path.name}"))
    config = {"source": SAY_IT_AGAIN.read_text()}
    r = client.post("/v1/environments", json={"name": "say-it-again", "kind": "python",
                                              "config": config})  # fmt: skip
    assert r.status_code == 201, r.text
    jsonl = "".join(json.dumps(rec) + "\n" for rec in digit_records(8))
    r = client.post("/v1/datasets", data={"name": "d"}, files={"file": ("d.jsonl", jsonl)})
    assert r.status_code == 201, r.text
    spec = {
        "base_model": TINY,
        "dataset": r.json()["id"],
        "environment": {"name": "say-it-again", "max_turns": 2},
        "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "learning_rate": 1e-3},
        "generation": {"max_new_tokens": 4},
    }
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["environment"]["version"] == 1  # pinned at submission
    final = wait_final(client, r.json()["id"])
    assert final["status"] == "succeeded", embedded_service.logs()
    rows = client.get(f"/v1/jobs/{final['id']}/metrics").json()["data"]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["turns_mean"] == 2 and row["errors/environment"] == 0
        turns = row["reward_turn/1"] + row["reward_turn/2"]
        assert row["reward_mean"] == pytest.approx(turns, abs=1e-6)
    page = client.get(f"/v1/jobs/{final['id']}/rollouts", params={"step": 1}).json()["data"]
    assert len(page) == 4
    for rollout in page:
        roles = [m["role"] for m in rollout["messages"]]
        assert roles == ["user", "assistant", "user", "assistant"]
        assert rollout["messages"][2]["content"] == "Say it again."
        assert set(rollout["scores"]) == {"turn/1", "turn/2"}
