"""The `grpo` CLI as a user runs it: a real process against the real service."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.shared import STEPS, Trained, job_spec, write_jsonl
from tests.e2e.services import free_port

SOURCE = "def verify(prompt, completion, **fields):\n    return float(len(completion) > 2)\n"


def grpo(
    *args: str, env: dict[str, str], code: int = 0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "grpo_client", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A user with an empty config dir and no GRPO_ variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "120"}


def test_login_stores_a_private_profile_and_env_overrides_it(
    clientside: Trained, env: dict[str, str], tmp_path: Path
) -> None:
    grpo("jobs", "list", env=env, code=2)  # no key yet: told to log in
    url, key = clientside.svc.base_url, clientside.key
    grpo("login", "--url", url, "--api-key", "grpo_sk_bad", env=env, code=1)
    out = grpo("login", "--json", env=env, stdin=f"{url}\n{key}\n")  # prompted for both
    path = tmp_path / "config" / "grpo" / "config.json"
    assert str(path) in out.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": url, "api_key": key}

    listed = json.loads(grpo("jobs", "list", "--json", env=env).stdout)
    assert clientside.job_id in [j["id"] for j in listed["data"]]
    bad = grpo("jobs", "list", env={**env, "GRPO_API_KEY": "grpo_sk_nope"}, code=1)
    assert "401" in bad.stderr and "grpo login" in bad.stderr
    down = grpo("jobs", "list", env={**env, "GRPO_URL": f"http://127.0.0.1:{free_port()}"}, code=3)
    assert "cannot reach" in down.stderr


def test_verifier_dataset_job_cancel_round_trip(
    clientside: Trained, env: dict[str, str], tmp_path: Path
) -> None:
    env = {**env, "GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": clientside.key}
    (tmp_path / "long.py").write_text(SOURCE)
    ver = json.loads(
        grpo(
            "verifiers", "create", str(tmp_path / "long.py"), "--name", "long", "--json", env=env
        ).stdout
    )
    assert ver["name"] == "long" and ver["version"] == 1
    samples = write_jsonl(
        tmp_path / "s.jsonl",
        [{"prompt": "p", "completion": "abc"}, {"prompt": "p", "completion": ""}],
    )
    scores = json.loads(grpo("verifiers", "test", "long", str(samples), "--json", env=env).stdout)
    assert scores["scores"] == [1.0, 0.0]
    table = grpo("verifiers", "test", "long", str(samples), env=env).stdout
    assert "2 samples" in table

    data = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {i}:"} for i in range(4)])
    ds = json.loads(grpo("datasets", "upload", str(data), "--json", env=env).stdout)
    assert ds["name"] == "prompts" and ds["num_records"] == 4

    spec = job_spec(ds["id"], verifiers=[{"name": "long"}])
    spec_file = tmp_path / "job.yaml"
    import yaml

    spec_file.write_text(yaml.safe_dump(spec))
    job = json.loads(grpo("jobs", "create", str(spec_file), "--json", env=env).stdout)
    assert job["status"] == "queued" and job["spec"]["verifiers"][0]["version"] == 1
    cancelled = json.loads(grpo("jobs", "cancel", job["id"], "--json", env=env).stdout)
    assert cancelled["status"] in ("cancelled", "cancelling")
    grpo("jobs", "watch", job["id"], "--interval", "0.5", env=env, code=1)  # did not succeed


def test_bad_input_gets_a_clear_message(
    clientside: Trained, env: dict[str, str], tmp_path: Path
) -> None:
    env = {**env, "GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": clientside.key}
    broken = tmp_path / "broken.yaml"
    broken.write_text("base_model: [unclosed\n")
    assert "not valid" in grpo("jobs", "create", str(broken), env=env, code=2).stderr
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert "mapping" in grpo("jobs", "create", str(listed), env=env, code=2).stderr
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"base_model": "m", "dataset": "ds_x", "verifiers": [],
                                   "grpo": {"steps": 0}}))  # fmt: skip
    out = grpo("jobs", "create", str(invalid), "--json", env=env, code=1)
    assert "$.grpo.steps" in out.stderr and "$.verifiers" in out.stderr
    assert json.loads(out.stdout)["error"]["status"] == 422
    missing = grpo("jobs", "create", str(tmp_path / "nope.yaml"), env=env, code=2)
    # typer draws usage errors in a box wrapped to the terminal width: read it as flat text
    flat = " ".join(missing.stderr.replace("│", " ").split())
    assert "does not exist" in flat, missing.stderr
    notjsonl = tmp_path / "s.jsonl"
    notjsonl.write_text("{not json\n")
    assert "line 1" in grpo("verifiers", "test", "x", str(notjsonl), env=env, code=2).stderr
    assert "404" in grpo("jobs", "get", "job_missing", env=env, code=1).stderr


def test_watch_and_download_a_finished_job(
    trained: Trained, env: dict[str, str], tmp_path: Path
) -> None:
    env = {**env, "GRPO_URL": trained.svc.base_url, "GRPO_API_KEY": trained.key}
    shown = grpo("jobs", "watch", trained.job_id, env=env).stdout
    assert f"{STEPS}/{STEPS}" in shown and "succeeded" in shown
    assert any(bar in shown for bar in "▁▂▃▄▅▆▇█") and "reward" in shown
    stream = grpo("jobs", "watch", trained.job_id, "--json", env=env).stdout.splitlines()
    lines = [json.loads(x) for x in stream if x.startswith(('{"metrics"', '{"event"'))]
    assert [x["metrics"]["step"] for x in lines if "metrics" in x] == list(range(1, STEPS + 1))
    assert "checkpoint" in [x["event"]["type"] for x in lines if "event" in x]

    out = grpo("checkpoints", "download", trained.job_id, "--step", "2",
               "--out", f"{tmp_path}/ckpts/", "--json", env=env)  # fmt: skip
    result = json.loads(out.stdout)
    assert result["step"] == 2 and Path(result["path"]).stat().st_size == result["bytes"]
    grpo("checkpoints", "download", trained.job_id, "--step", "two", env=env, code=2)
    listed = json.loads(grpo("checkpoints", "list", trained.job_id, "--json", env=env).stdout)
    assert sorted(c["step"] for c in listed) == list(range(1, STEPS + 1))
