"""Pre-flight through the real processes (API + worker, tiny model): a reward with no spread,
a regex reward on the digit task, a python verifier that raises, and a job that requires a
pre-flight refusing itself before its first step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.demo_task import digit_records
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import wait_final

FIGURES = {
    "reward_mean", "reward_std", "zero_std_fraction", "verifier_error_rate",
    "truncated_fraction", "completion_len_mean", "seconds_per_step_estimate", "memory_estimate",
    "warnings", "samples",
}  # fmt: skip
CONSTANT = "def verify(prompt, completion, **fields):\n    return 0.5\n"
RAISES = "def verify(prompt, completion, **fields):\n    raise ValueError('broken on purpose')\n"
GROUP = 4


@pytest.fixture(scope="module")
def client(embedded_service: RunningService) -> httpx.Client:
    c = embedded_service.client(embedded_service.new_key("preflight"))
    verifiers = [
        {"name": "constant", "kind": "python", "config": {"source": CONSTANT}},
        {"name": "raises", "kind": "python", "config": {"source": RAISES}},
        {"name": "has-digit", "kind": "regex", "config": {"pattern": "[0-9]"}},
    ]
    for v in verifiers:
        assert c.post("/v1/verifiers", json=v).status_code == 201
    jsonl = "".join(json.dumps(r) + "\n" for r in digit_records(16))
    r = c.post("/v1/datasets", data={"name": "digits"}, files={"file": ("d.jsonl", jsonl)})
    assert r.status_code == 201, r.text
    return c


def spec(verifier: str, **extra: Any) -> dict[str, Any]:
    return {
        "base_model": TINY,
        "dataset": "digits",
        "verifiers": [{"name": verifier}],
        "grpo": {"steps": 3, "prompts_per_step": 8, "group_size": GROUP, "learning_rate": 1e-3},
        "generation": {"max_new_tokens": 8},
        **extra,
    }


def preflight(client: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The final pre-flight (following a 202's Location) and its wall time."""
    start = time.monotonic()
    r = client.post("/v1/jobs/preflight", json=body, timeout=120)
    assert r.status_code in (200, 202), r.text
    result = r.json()
    while result["status"] not in ("succeeded", "failed"):
        assert time.monotonic() - start < 300, result
        time.sleep(0.2)
        result = client.get(r.headers["location"]).json()
    return result, time.monotonic() - start


def fatal(result: dict[str, Any]) -> set[str]:
    return {w["code"] for w in result["warnings"] if w["fatal"]}


def test_constant_reward_is_flagged(client: httpx.Client, embedded_service: RunningService) -> None:
    result, seconds = preflight(client, spec("constant"))
    print(f"pre-flight wall time on the tiny model: {seconds:.2f} s")
    assert result["status"] == "succeeded", result
    assert set(result) >= FIGURES
    assert result["zero_std_fraction"] == 1.0 and result["reward_std"] == 0.0
    assert result["reward_mean"] == 0.5 and result["verifier_error_rate"] == 0.0
    assert "all_groups_zero_spread" in fatal(result)
    assert result["seconds_per_step_estimate"] == pytest.approx(2 * result["step_seconds"])
    assert result["memory_estimate"]["total"] > 0
    assert client.get("/v1/jobs").json()["data"] == []  # no job was created
    stranger = embedded_service.client(embedded_service.new_key("preflight-stranger"))
    assert stranger.get(f"/v1/jobs/preflight/{result['id']}").status_code == 404
    assert client.get(f"/v1/jobs/preflight/{result['id']}").json() == result
    # metered: the device time its worker held, from the claim to the outcome
    held = datetime.fromisoformat(result["finished_at"]) - datetime.fromisoformat(
        result["started_at"]
    )
    usage = client.get("/v1/usage", params={"group_by": "job"}).json()
    assert [r["job_id"] for r in usage["data"]] == [result["id"]]
    assert usage["totals"]["device_seconds"] == pytest.approx(held.total_seconds(), abs=1e-3)
    assert 0 < held.total_seconds() < 300


def test_regex_reward_figures_match_the_samples(client: httpx.Client) -> None:
    result, _ = preflight(client, spec("has-digit"))
    assert result["status"] == "succeeded", result
    groups: dict[int, list[float]] = {}
    for s in result["samples"]:
        groups.setdefault(s["group"], []).append(s["reward"])
        assert s["reward"] in (0.0, 1.0) and s["errors"] == {}
    assert len(groups) == 4 and all(len(g) == GROUP for g in groups.values())
    flat = sum(len(set(g)) == 1 for g in groups.values()) / len(groups)
    assert result["zero_std_fraction"] == flat
    rewards = [r for g in groups.values() for r in g]
    assert result["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    truncated = [s["truncated"] for s in result["samples"]]
    assert result["truncated_fraction"] == pytest.approx(sum(truncated) / len(truncated))
    assert result["verifier_error_rate"] == 0.0 and "verifier_errors" not in fatal(result)
    assert (flat == 1.0) == ("all_groups_zero_spread" in fatal(result))


def test_raising_python_verifier_is_fatal(client: httpx.Client) -> None:
    result, _ = preflight(client, spec("raises"))
    assert result["status"] == "succeeded", result
    assert result["verifier_error_rate"] == 1.0
    assert "verifier_errors" in fatal(result)
    assert "broken on purpose" in result["samples"][0]["errors"]["raises"]


def test_required_preflight_refuses_the_job(client: httpx.Client) -> None:
    r = client.post("/v1/jobs", json=spec("constant", preflight="require"))
    assert r.status_code == 201, r.text
    job = wait_final(client, r.json()["id"], timeout=300)
    assert job["status"] == "failed" and job["step"] == 0, job
    assert job["error"]["code"] == "preflight_failed"
    assert "all groups score the same" in job["error"]["message"]
    assert client.get(f"/v1/jobs/{job['id']}/metrics").json()["data"] == []
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    (event,) = [e for e in events if e["type"] == "preflight"]
    assert event["data"]["zero_std_fraction"] == 1.0
    assert "all_groups_zero_spread" in {w["code"] for w in event["data"]["warnings"]}


def test_bad_body_answers_as_a_job_submission(client: httpx.Client) -> None:
    body = spec("ghost", grpo={"group_size": 1})
    as_job, as_preflight = (client.post(p, json=body) for p in ("/v1/jobs", "/v1/jobs/preflight"))
    assert as_preflight.status_code == as_job.status_code == 422
    assert as_preflight.json() == as_job.json()


def test_cli_stops_before_a_doomed_job_unless_forced(
    client: httpx.Client, embedded_service: RunningService, tmp_path: Path
) -> None:
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(spec("constant")))
    env = {
        **embedded_service.env,
        "GRPO_URL": embedded_service.base_url,
        "GRPO_API_KEY": client.headers["authorization"].removeprefix("Bearer "),
        "HOME": str(tmp_path),  # no stored login of the machine's
    }
    grpo = [sys.executable, "-m", "grpo_client", "jobs", "create", str(job_file)]
    before = client.get("/v1/jobs").json()["data"]
    stopped = subprocess.run(
        [*grpo, "--preflight"], env=env, capture_output=True, text=True, timeout=300
    )
    assert stopped.returncode == 1, stopped.stderr
    assert "all_groups_zero_spread" in stopped.stderr and "no job submitted" in stopped.stderr
    assert client.get("/v1/jobs").json()["data"] == before  # nothing was submitted

    # --force: the same fatal warning is shown, and the job is submitted all the same.
    forced = subprocess.run(
        [*grpo, "--preflight", "--force", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert "all_groups_zero_spread" in forced.stderr and "no job submitted" not in forced.stderr
    job = json.loads(forced.stdout)
    assert job["status"] == "queued" and job["spec"]["verifiers"][0]["name"] == "constant"
    after = client.get("/v1/jobs").json()["data"]
    assert [j["id"] for j in after] == [job["id"], *(j["id"] for j in before)]
    client.post(f"/v1/jobs/{job['id']}/cancel")  # no need to train it
